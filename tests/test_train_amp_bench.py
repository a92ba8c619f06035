"""train_amp.py --benchmark and the repository's benchmarks/bench_amp.py and bench_input.py,
run tiny in the image on CPU: their timings, reports and JSON."""
import json
import re

import pytest
from conftest import ROOT, SLOWDOWN
from train_amp_helpers import read_from_container


def test_benchmark_times_steps_and_writes_json(start_container):
    """--benchmark should time steps on a device-resident batch and write benchmark.json."""
    c = start_container(["train_amp.py", "--benchmark", "--model", "resnet18", "--image-size",
                         "32", "--batch-size", "8", "--steps", "3", "--warmup-steps", "1",
                         "--out", "bench"])
    code = c.wait(timeout=300 * SLOWDOWN)["StatusCode"]
    logs = c.logs().decode(errors="replace")
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"benchmark resnet18 batch 8 32px amp=(bf16|off) .*: [\d.]+ images/s", logs), logs
    result = json.loads(read_from_container(c, "/workspace/bench/benchmark.json"))
    assert result["images_per_s"] > 0 and result["measured_steps"] == 3, f"bad result: {result}"
    assert result["loss_is_finite"], f"the benchmark's loss went non-finite: {result}"


def run_repo_script(run_in_image, script):
    """Run a bash line in the image with the repository's benchmarks/ at /repo/benchmarks (they
    are not in the image); fail with the logs unless it exits 0. Returns the logs."""
    code, logs = run_in_image(["bash", "-c", script], timeout=600,
                              volumes={str(ROOT / "benchmarks"): {"bind": "/repo/benchmarks",
                                                                  "mode": "ro"}})
    assert code == 0, f"{script.split()[1]} exited {code}:\n{logs}"
    return logs


def test_bench_amp_script_measures_matrix_and_jpeg_parts_on_cpu(run_in_image):
    """benchmarks/bench_amp.py (the GPU benchmark) should run its parts end to end: tiny on CPU."""
    script = ("python /repo/benchmarks/bench_amp.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 8 --steps 1 --warmup-steps 1 --only matrix-eager,jpeg"
              " --precisions fp32-strict,amp-bf16 --jpeg-images 48 --jpeg-dir /tmp/jpegs"
              " --out /tmp/bench.json && cat /tmp/bench.json")
    logs = run_repo_script(run_in_image, script)
    assert "| amp-bf16 | on | off |" in logs and "### JPEG ImageFolder (48 images" in logs, logs
    report = json.loads(logs[logs.index("\n{") + 1:])
    assert len(report["matrix"]) == 4 and all(m["images_per_s"] > 0 for m in report["matrix"])
    runs = report["jpeg"]["runs"]
    assert runs and all(r.get("loader_only_ips", 0) > 0 and r.get("train_ips", 0) > 0
                        for r in runs), runs


def test_bench_input_script_compares_synthetic_and_jpeg_rates_on_cpu(run_in_image):
    """benchmarks/bench_input.py (synthetic vs JPEG images/s) should make its JPEGs and tar shards and
    print images/s per --decode path with the ratio to synthetic data, over interleaved rounds
    with --repeat (median and range): tiny, on CPU."""
    script = ("python /repo/benchmarks/bench_input.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 16 --images 64 --classes 4 --max-side 96 --epochs 2"
              " --rows synthetic,device,tar --repeat 2 --jpeg-dir /tmp/bi --out /tmp/bi.json"
              " && cat /tmp/bi.json")
    logs = run_repo_script(run_in_image, script)
    assert re.search(r"^\| JPEG ImageFolder \| device \| \d+ \(\d+-\d+\) \|"
                     r" [\d.]+ \([\d.]+-[\d.]+\) \|$", logs, re.MULTILINE), (
        f"no JPEG row with its median, range and ratio:\n{logs}")
    report = json.loads(logs[logs.index("\n{") + 1:])
    assert [(r["label"], r["round"]) for r in report["rows"]] == [
        (label, k) for k in (1, 2) for label in ("synthetic", "device", "tar")], report["rows"]
    rows = {r["label"]: r for r in report["rows"]}
    assert all(r.get("ips", 0) > 0 and len(r["epoch_ips"]) == 2 for r in report["rows"]), (
        report["rows"])
    assert rows["tar"]["decode"] == "workers", f"auto on CPU must pick workers: {rows['tar']}"
    assert report["page_cache"].startswith("warm"), report


def bench_report_logs(run_in_image, body):
    """The logs of bench_input.print_report called by `body`, in the image, through
    report(images, rows): a ResNet-50 batch-256 report of those rows, made up, no training."""
    return run_repo_script(run_in_image, f"""python - <<'EOF'
import sys
sys.path.insert(0, "/repo/benchmarks")
import bench_input
def report(images, rows):
    bench_input.print_report({{
        "model": "resnet50", "batch_size": 256, "image_size": 224, "gpu": "GPU", "cpus": 16,
        "torch": "2", "images": images, "mean_kib": 85, "epochs": 4, "page_cache": "warm",
        "repeat": 1, "rows": rows}})
{body}
EOF""")


def test_bench_input_warns_when_an_epoch_has_too_few_batches_for_its_workers(run_in_image):
    """bench_input.py's report should say that a workers row understates the workers when they
    outnumber half its batches an epoch (photos in a small set: 8 batches for 15 workers), and
    say nothing when each worker gets two batches an epoch."""
    logs = bench_report_logs(run_in_image, """
for steps in (8, 30):
    print(f"== {steps} batches an epoch")
    report(steps * 256, [
        {"label": "synthetic", "ips": 6400.0, "round": 1},
        {"label": "workers", "decode": "workers", "ips": 208.0, "round": 1,
         "steps_per_epoch": steps, "num_workers": 15},
        {"label": "device", "decode": "device", "ips": 850.0, "round": 1}])
""")
    few, enough = logs.split("== 30 batches an epoch")
    assert re.search(r"^caution: the workers row had 8 batches an epoch for 15 workers.*"
                     r"--images 7680 or more", few, re.MULTILINE), f"no caution:\n{few}"
    assert few.count("caution") == 1, f"only the workers row gets one:\n{few}"
    assert "caution" not in enough, f"a caution with two batches per worker:\n{enough}"


def test_bench_input_header_counts_rows_of_one_name_without_repeat(run_in_image):
    """A row name given twice in --rows (no --repeat) should get a header that counts its rows,
    not "a range of 1 interleaved rounds"."""
    logs = bench_report_logs(run_in_image, """
report(8192, [{"label": "synthetic", "ips": 6400.0, "round": 1}] + [
    {"label": "device", "decode": "device", "ips": v, "round": 1} for v in (5500.0, 5700.0)])
""")
    assert "(median, range of up to 2 rows of one name)" in logs, logs
    assert "interleaved rounds" not in logs, logs
    assert re.search(r"^\| JPEG ImageFolder \| device \| 5600 \(5500-5700\) \| 0\.88 \(0\.86-0\.89\) \|$",
                     logs, re.MULTILINE), logs


def test_bench_input_replay_rows_stop_the_loader_and_decode_once(run_in_image):
    """bench_input.py's device-replay row should take only the first epoch's batches from the
    loader and replay them (every batch still decoded), device-decode-once should also decode
    each kept batch only once: what the README's figures for them rest on."""
    script = ("python /repo/benchmarks/bench_input.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 16 --images 64 --classes 4 --max-side 96 --epochs 3"
              " --rows device-replay,device-decode-once --jpeg-dir /tmp/bi --out /tmp/bi.json"
              " && cat /tmp/bi.json")
    logs = run_repo_script(run_in_image, script)
    rows = {r["label"]: r for r in json.loads(logs[logs.index("\n{") + 1:])["rows"]}
    # 64 images in batches of 16: 4 batches an epoch, 12 in 3 epochs.
    assert rows["device-replay"].get("batches") == {"loaded": 4, "replayed": 8, "decoded": 12}, rows
    assert rows["device-decode-once"].get("batches") == {"loaded": 4, "replayed": 8, "decoded": 4}, rows
    assert all(len(r.get("epoch_ips", [])) == 3 for r in rows.values()), rows


# Slow (a torch.compile, 77 s in CI): test_cluster's compiled run keeps the nameless-UID compile in
# make test; this one (benchmarks/bench_amp.py's compiled rows) runs in make test-slow, weekly.
@pytest.mark.slow
def test_bench_amp_compiles_as_a_uid_without_a_passwd_entry(run_in_image):
    """benchmarks/bench_amp.py started without the entrypoint as a UID with no passwd entry (as
    pyxis or a Kubernetes `command:` start it) should still torch.compile: Inductor names its
    cache after the user."""
    script = ("python /repo/benchmarks/bench_amp.py --device cpu --model resnet18 --image-size 32"
              " --batch-size 8 --steps 1 --warmup-steps 1 --only tuned --out /tmp/bench.json"
              " && cat /tmp/bench.json")
    code, logs = run_in_image(["bash", "-c", script], timeout=600, entrypoint="",
                              user="12345:12345",
                              volumes={str(ROOT / "benchmarks"): {"bind": "/repo/benchmarks",
                                                                  "mode": "ro"}})
    assert code == 0, f"bench_amp.py exited {code}:\n{logs}"
    report = json.loads(logs[logs.index("\n{") + 1:])
    runs = [m for m in report["matrix"] if m.get("compile") == "tuned"]
    assert len(runs) == 1 and "error" not in runs[0] and runs[0]["images_per_s"] > 0, (
        f"the compiled configuration did not run: {runs}")

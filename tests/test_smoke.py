"""Container should prove its GPU stack with the shipped smoke suite (`smoke`): on this CPU-only
host it passes with every GPU test skipped with a reason, --require-gpu turns those skips into
failures, a too-small /dev/shm fails naming --shm-size, and reports land in a mounted directory."""
import json
import xml.etree.ElementTree as ET

import pytest
from conftest import BARE_EXEC, QEMU_CPU
from train_amp_helpers import run_to_end

SUITE_TIMEOUT = 600  # the full suite on 2 CPU cores, torch.compile included, takes ~1-2 min


def _writable_dir(tmp_path, name):
    # The suite runs as the image's non-root user, whatever UID it is mapped to.
    d = tmp_path / name
    d.mkdir()
    d.chmod(0o777)
    return d


def _tail(output, n=6000):
    return output[-n:]


@pytest.fixture(scope="module")
def whole_suite(docker_client, image_ref, image, tmp_path_factory, module_containers):
    """The whole suite, run once for the module (a minute of CPU): as pyxis, Kubernetes and
    Apptainer run it (no entrypoint, a UID with no passwd entry, a read-only root: BARE_EXEC),
    the hardest case, with the image's labels as --expect-versions and its reports in a mounted
    directory. -> (exit code, output, the reports directory); the tests below only look."""
    tmp = tmp_path_factory.mktemp("smoke")
    reports, expect = _writable_dir(tmp, "reports"), tmp / "expect"
    expect.mkdir()
    (expect / "labels.json").write_text(json.dumps(image.labels))
    code, output, c = run_to_end(
        docker_client, image_ref,
        ["smoke", "--report-dir", "/reports", "--expect-versions", "/expect/labels.json"],
        timeout=SUITE_TIMEOUT, environment={"QEMU_CPU": QEMU_CPU} if QEMU_CPU else {},
        volumes={str(reports): {"bind": "/reports", "mode": "rw"},
                 str(expect): {"bind": "/expect", "mode": "ro"}}, **BARE_EXEC)
    module_containers.append(c)
    return code, output, reports


def test_smoke_suite_passes_on_cpu_host_as_a_nameless_uid_with_gpu_tests_skipped_with_reason(
        whole_suite):
    """Container should pass the whole suite on a CPU host, versions equal to its labels, GPU
    tests skipped; run as pyxis, Kubernetes and Apptainer run it (no entrypoint, a UID with no
    passwd entry, a read-only root: BARE_EXEC), the hardest case, once. The entrypoint's way in
    to `smoke` is the other tests' here."""
    code, output, reports = whole_suite
    assert code == 0, f"smoke suite failed (exit {code}):\n{_tail(output)}"
    report = json.loads((reports / "smoke-report.json").read_text())
    tests = report["tests"]
    by_outcome = {k: [t for t in tests if t["outcome"] == k] for k in ("passed", "failed", "skipped")}
    assert not by_outcome["failed"], f"failed tests: {by_outcome['failed']}"
    assert by_outcome["skipped"], "no GPU test skipped on a CPU-only host: the GPU checks are missing"
    unexplained = [t for t in by_outcome["skipped"]
                   if "CUDA" not in t.get("message", "") and "GPU" not in t.get("message", "")]
    assert not unexplained, f"skips without a GPU reason: {unexplained}"
    # The CPU equivalents must really run: AMP (fp16+GradScaler, bf16), gloo, DataLoader, compile.
    passed = {t["nodeid"] for t in by_outcome["passed"]}
    for needed in ("test_amp.py::test_fp16_grad_scaler_training_lowers_the_loss_and_keeps_fp32_weights[cpu]",
                   "test_amp.py::test_bf16_autocast_trains_without_a_grad_scaler[cpu]",
                   "test_distributed.py::test_gloo_all_reduce_across_two_processes_sums",
                   "test_dataloader.py::test_dataloader_workers_pass_real_batches_through_shared_memory",
                   "test_compile.py::test_compiled_model_trains_a_step_like_eager[cpu]"):
        assert needed in passed, f"{needed} did not pass on the CPU host"
    compared = {t["nodeid"].rsplit("[", 1)[1].rstrip("]") for t in by_outcome["passed"]
                if "test_loaded_version_equals_expected" in t["nodeid"]}
    assert compared >= {"torch", "torchvision", "torchaudio", "cuda", "cudnn", "nccl"}, (
        f"only {sorted(compared)} were checked against the image labels")


def test_smoke_report_lands_in_mounted_directory(whole_suite):
    """Container should write smoke-junit.xml and smoke-report.json into the --report-dir mount
    (the whole suite's run: a run of its own showed nothing more), the two agreeing."""
    code, output, reports = whole_suite
    assert (reports / "smoke-junit.xml").exists(), f"no smoke-junit.xml (exit {code}):\n{_tail(output)}"
    junit = ET.parse(reports / "smoke-junit.xml").getroot()
    suite = junit if junit.tag == "testsuite" else junit.find("testsuite")
    report = json.loads((reports / "smoke-report.json").read_text())
    assert int(suite.get("tests")) == len(report["tests"]) > 0, (
        f"JUnit lists {suite.get('tests')} tests, the JSON report {len(report['tests'])}")
    assert int(suite.get("failures")) == int(suite.get("errors")) == report["summary"]["failed"] == 0, (
        f"report shows failures: junit {suite.attrib}, json {report['summary']}")


@pytest.mark.parametrize("flag,env", [("--require-gpu", {}), ("", {"SMOKE_REQUIRE_GPU": "1"})],
                         ids=["flag", "env"])
def test_require_gpu_turns_gpu_skips_into_failures_on_cpu_host(run_in_image, tmp_path, flag, env):
    """Container should fail every GPU test, not skip it, when a GPU is required and none is visible."""
    reports = _writable_dir(tmp_path, "reports")
    # -m gpus: only the GPU tests, the ones that skip on this host; the CPU ones are covered above.
    code, output = run_in_image(f"smoke -m gpus {flag} --report-dir /reports", environment=env,
                                timeout=SUITE_TIMEOUT,
                                volumes={str(reports): {"bind": "/reports", "mode": "rw"}})
    assert code == 1, f"smoke with a GPU required exited {code}, expected 1 (tests failed):\n{_tail(output)}"
    report = json.loads((reports / "smoke-report.json").read_text())
    failed = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert failed, f"no test failed:\n{_tail(output)}"
    assert not [t for t in report["tests"] if t["outcome"] == "passed"], "a GPU test passed without a GPU"
    for t in failed:
        assert "--require-gpu" in t["message"] and "no CUDA device visible" in t["message"], (
            f"{t['nodeid']} failed without naming --require-gpu and the skip reason: {t['message']}")
    # Only the multi-GPU test may still skip: it needs more GPUs than the one required.
    still_skipped = [t["nodeid"] for t in report["tests"] if t["outcome"] == "skipped"]
    assert all("test_nccl_all_reduce_across_processes_sums" in n for n in still_skipped), (
        f"tests still skipped under a required GPU: {still_skipped}")


def test_dataloader_test_names_shm_size_when_dev_shm_is_too_small(run_in_image):
    """Container started with a 1 MiB /dev/shm should fail the DataLoader test, naming --shm-size."""
    code, output = run_in_image("smoke -k dataloader", shm_size="1m", timeout=SUITE_TIMEOUT)
    assert code == 1, f"smoke -k dataloader exited {code} with a 1 MiB /dev/shm:\n{_tail(output)}"
    assert "--shm-size" in output and "/dev/shm is 1 MiB" in output, (
        f"the failure does not tell the user to raise --shm-size:\n{_tail(output)}")


def test_version_checks_without_expectations_skip_and_fail_when_a_gpu_is_required(run_in_image, tmp_path):
    """Container smoke without expected versions should skip the version checks with a reason, and fail them under --require-gpu."""
    # A bare GPU host has no /usr/share/team-image/versions.json: an empty tmpfs stands in.
    bare = {"tmpfs": {"/usr/share/team-image": ""}}
    outcomes = {}
    for flag in ("", "--require-gpu"):
        reports = _writable_dir(tmp_path, f"reports{flag}")
        code, output = run_in_image(f"smoke -k test_loaded_version_equals_expected {flag} --report-dir /reports",
                                    timeout=SUITE_TIMEOUT, **bare,
                                    volumes={str(reports): {"bind": "/reports", "mode": "rw"}})
        tests = json.loads((reports / "smoke-report.json").read_text())["tests"]
        assert len(tests) == 7, f"expected the 7 version checks to be collected, got {tests}:\n{_tail(output)}"
        outcomes[flag] = (code, {t["outcome"] for t in tests}, {t.get("message", "") for t in tests})
    code, kinds, messages = outcomes[""]
    assert (code, kinds) == (0, {"skipped"}), f"without --require-gpu they should skip: {outcomes['']}"
    assert all("--expect-versions" in m for m in messages), f"each skip should name --expect-versions: {messages}"
    code, kinds, messages = outcomes["--require-gpu"]
    assert (code, kinds) == (1, {"failed"}), f"--require-gpu should turn those skips into failures: {outcomes['--require-gpu']}"
    assert all("--require-gpu" in m and "--expect-versions" in m for m in messages), messages


def test_require_gpus_2_fails_the_multi_gpu_test_too(run_in_image, tmp_path):
    """Container smoke with --require-gpus 2 should fail, not skip, even the 2-GPU NCCL test."""
    reports = _writable_dir(tmp_path, "reports")
    code, output = run_in_image("smoke -k test_nccl --require-gpus 2 --report-dir /reports",
                                timeout=SUITE_TIMEOUT,
                                volumes={str(reports): {"bind": "/reports", "mode": "rw"}})
    assert code == 1, f"smoke --require-gpus 2 exited {code}, expected 1:\n{_tail(output)}"
    tests = {t["nodeid"]: t for t in json.loads((reports / "smoke-report.json").read_text())["tests"]}
    multi = [t for n, t in tests.items() if "test_nccl_all_reduce_across_processes_sums" in n]
    assert multi and multi[0]["outcome"] == "failed", f"the 2-GPU test should fail under --require-gpus 2: {tests}"
    assert "--require-gpu" in multi[0]["message"], f"the failure should name --require-gpu: {multi[0]}"
    assert not [n for n, t in tests.items() if t["outcome"] != "failed"], f"every NCCL test should fail: {tests}"

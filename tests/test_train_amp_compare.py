"""train_amp.py --compare on digits: the FP32-vs-bf16 table, its .md/.json/.png files, and bf16
accuracy within one point of FP32."""
import json

import pytest
from train_amp_helpers import DIGITS, read_from_container, run_to_end


@pytest.fixture(scope="module")
def comparison(docker_client, image_ref, module_containers):
    """--compare on digits: FP32 vs bf16 autocast, 4 epochs each (both reach ~98%)."""
    code, logs, c = run_to_end(docker_client, image_ref, [
        "train_amp.py", *DIGITS, "--epochs", "4", "--log-every", "50", "--compare",
        "--out", "report"])
    module_containers.append(c)
    assert code == 0, f"--compare failed ({code}):\n{logs}"
    files = {n: read_from_container(c, f"/workspace/report/{n}")
             for n in ("compare.json", "compare.md", "compare.png")}
    return logs, files


def test_compare_prints_a_markdown_table_and_writes_json_and_png(comparison):
    """--compare should print the FP32-vs-AMP table and write it as .md, .json and .png."""
    logs, files = comparison
    for row in ("| metric | FP32 (TF32 off) | AMP bf16 | AMP/FP32 |", "| images/s |",
                "| epoch time (s) |", "| peak GPU memory (GiB) |",
                "| final validation loss |", "| final validation accuracy (%) |"):
        assert row in logs, f"table row {row!r} missing:\n{logs}"
    assert "CPU run: FP32 vs bf16 autocast" in logs, f"CPU comparison not labelled:\n{logs}"
    assert files["compare.md"] and b"| images/s |" in files["compare.md"], "compare.md missing"
    assert files["compare.png"] and files["compare.png"].startswith(b"\x89PNG"), "no PNG chart"
    report = json.loads(files["compare.json"])
    for key in ("images_per_s", "epoch_time", "peak_mem", "accuracy_diff_pt"):
        assert key in report["ratios"], f"compare.json lacks ratio {key}: {report['ratios']}"
    assert report["ratios"]["images_per_s"] > 0, f"no speed ratio: {report['ratios']}"


def test_digits_bf16_accuracy_is_within_one_point_of_fp32(comparison):
    """Digits accuracy after the same steps with bf16 autocast should be within 1 point of FP32."""
    _, files = comparison
    report = json.loads(files["compare.json"])
    fp32 = report["fp32"]["final"]["val_acc"]
    bf16 = report["amp_run"]["final"]["val_acc"]
    # Both must have learned (10 classes: chance is 10%), or agreement would mean nothing.
    assert fp32 > 90 and bf16 > 90, f"digits not learned: FP32 {fp32:.2f}%, bf16 {bf16:.2f}%"
    assert abs(bf16 - fp32) <= 1.0, f"bf16 {bf16:.2f}% vs FP32 {fp32:.2f}%: more than 1 point"

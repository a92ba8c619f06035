"""train_amp.py's command line, run in fresh containers of the image: --help, and bad or
out-of-range input refused at once (exit 2, one line naming the fix)."""
import pytest
from conftest import SLOWDOWN
from train_amp_helpers import SYNTH, command_output


def test_help_documents_every_option(run_in_image):
    """train_amp.py should be on PATH and --help should document every option and data source."""
    code, logs = run_in_image(["train_amp.py", "--help"])
    assert code == 0, f"--help exited {code}:\n{logs}"
    for option in ("--model", "--data", "--epochs", "--steps", "--batch-size", "--lr", "--amp",
                   "--channels-last", "--compile", "--grad-clip", "--num-workers",
                   "--checkpoint-dir", "--resume", "--seed", "--benchmark", "--compare",
                   "--tensorboard", "digits", "synthetic", "ImageFolder", "WebDataset", "KEY.cls", "torchrun",
                   "--overwrite", "--skip-bad-images", "exit status"):
        assert option in logs, f"--help does not mention {option}:\n{logs}"


@pytest.mark.parametrize("args, env, fix", [
    (["--model", "resnet5O"], {}, "did you mean resnet50"),
    (["--data", "/no/such/folder"], {}, "give an ImageFolder path"),
    (["--batch-size", "0"], {}, "--batch-size 64"),
    (["--amp", "fp16"], {}, "on CPU use --amp bf16"),
    # Inductor compiles with $CXX: pointing it at nothing is "no compiler" without breaking
    # the image for other tests.
    (["--compile"], {"CXX": "/nonexistent/g++"}, "install g++"),
    (["--cuda-graphs"], {}, "drop --cuda-graphs"),
    (["--decode-cpu-share", "1.5"], {}, "--decode-cpu-share 0.3"),
    (["--auto-resume", "--resume", "other/last.pt"], {}, "without --resume PATH or --overwrite"),
], ids=["unknown-model", "missing-data-path", "batch-size-0", "fp16-on-cpu",
        "compile-without-compiler", "cuda-graphs-without-gpu", "cpu-share-above-1",
        "auto-resume-with-resume"])
def test_bad_input_exits_2_with_a_one_line_fix(start_container, args, env, fix):
    """Container should refuse bad input at once: exit 2 and one stderr line naming the fix."""
    c = start_container(["train_amp.py", *args], environment=env)
    code = c.wait(timeout=120 * SLOWDOWN)["StatusCode"]
    err = command_output(c.logs(stdout=False, stderr=True).decode(errors="replace"))
    out = command_output(c.logs(stdout=True, stderr=False).decode(errors="replace"))
    assert code == 2, f"{args} exited {code}, expected 2:\n{err}"
    assert len(err) == 1 and err[0].startswith("train_amp.py: error: "), (
        f"{args} should print exactly one 'train_amp.py: error:' line, got:\n" + "\n".join(err))
    assert fix in err[0], f"{args}: the error does not give the fix {fix!r}: {err[0]}"
    assert not out, f"{args} should stop before any training output, printed:\n{out}"


@pytest.mark.parametrize("args, rule", [
    (["--lr", "nan"], "argument --lr: must be a finite number > 0, got nan"),
    (["--lr", "-1"], "argument --lr: must be a finite number > 0, got -1"),
    (["--weight-decay", "inf"], "argument --weight-decay: must be a finite number >= 0"),
    (["--grad-clip", "-0.5"], "argument --grad-clip: must be a finite number >= 0"),
    (["--save-every-minutes", "nan"], "argument --save-every-minutes: must be a finite number >= 0"),
], ids=["lr-nan", "lr-negative", "weight-decay-inf", "grad-clip-negative", "save-minutes-nan"])
def test_non_finite_or_out_of_range_numbers_exit_2_before_training(start_container, args, rule):
    """train_amp.py should reject NaN/inf/out-of-range numeric options at parse time: exit 2."""
    c = start_container(["train_amp.py", *SYNTH, "--steps", "1", *args])
    code = c.wait(timeout=120 * SLOWDOWN)["StatusCode"]
    err = command_output(c.logs(stdout=False, stderr=True).decode(errors="replace"))
    out = command_output(c.logs(stdout=True, stderr=False).decode(errors="replace"))
    assert code == 2, f"{args} exited {code}, expected 2:\n" + "\n".join(err + out)
    assert err and err[-1].startswith(f"train_amp.py: error: {rule}"), (
        f"{args}: expected the error {rule!r}, got:\n" + "\n".join(err))
    assert "(e.g. --" in err[-1], f"{args}: the error gives no example value: {err[-1]}"
    assert not out, f"{args} should stop before any training output, printed:\n{out}"

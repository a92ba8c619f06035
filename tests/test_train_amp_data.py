"""train_amp.py's data sources in the image, on CPU: JPEG ImageFolders and tar shards with either
--decode path, corrupt or damaged data, and --decode auto's choice."""
import re
import shlex

import pytest
from train_amp_helpers import MAKE_JPEGS, STEP_FN, SUMMARY, run_to_end, show, steps_of


@pytest.mark.parametrize("decode", ["workers", "device"])
def test_imagefolder_of_jpegs_trains_and_validates(run_in_image, decode):
    """Container should train on JPEGs decoded in the workers or on the device, and score val/."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32"
              f" --batch-size 16 --epochs 1 --num-workers 2 --lr 0.05 --decode {decode}")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "(48 train images, 2 classes, 32px)" in logs, f"ImageFolder not read:\n{logs}"
    assert re.search(r"^epoch 1/1: .* val_acc [\d.]+%", logs, re.MULTILINE), f"no val accuracy:\n{logs}"
    assert "JPEGs are large" not in logs, f"a size note for 40 x 30 px JPEGs:\n{logs}"


def test_large_jpegs_get_a_note_to_pre_resize_them(run_in_image):
    """JPEGs far larger than the training crop (here 640 x 480 px for 32 px) should get one
    note at start naming their size and the pre-resize size (the 40 x 30 px ones of the test
    above get none)."""
    make = MAKE_JPEGS.replace("(40, 30)", "(640, 480)")
    assert make != MAKE_JPEGS
    script = (f"python3 - <<'EOF'\n{make}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --epochs 1 --num-workers 2 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert logs.count("note: the JPEGs are large (median 640 x 480 px over 24 sampled") == 1, (
        f"no (or more than one) size note:\n{logs}")
    assert "shorter side to 36 px (README: Pre-resize)" in logs, logs


@pytest.fixture(scope="module", params=["workers", "device"])
def corrupt_jpeg_runs(request, docker_client, image_ref, module_containers):
    """The JPEG ImageFolder with one train file truncated to 100 bytes: a plain run, then one
    with --skip-bad-images (2 epochs), decoding in the workers or on the device."""
    job = ["train_amp.py", "--data", "imgs", "--model", "resnet18", "--image-size", "32",
           "--batch-size", "16", "--num-workers", "2", "--lr", "0.05", "--checkpoint-dir", "",
           "--progress", "lines", "--decode", request.param]
    lines = [STEP_FN, f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF",
             "head -c 100 imgs/train/class0/3.jpg > cut && mv cut imgs/train/class0/3.jpg",
             "step plain " + shlex.join(job + ["--epochs", "1"]),
             "step skip " + shlex.join(job + ["--epochs", "2", "--skip-bad-images"])]
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", "\n".join(lines)])
    module_containers.append(c)
    assert code == 0, f"the corrupt-JPEG script failed ({code}):\n{logs}"
    return request.param, steps_of(logs)


def test_a_corrupt_jpeg_stops_the_run_with_an_error_naming_the_file(corrupt_jpeg_runs):
    """A truncated JPEG should stop training with exit 2 and one error naming the file."""
    decode, runs = corrupt_jpeg_runs
    plain = runs["plain"]
    assert plain["rc"] == 2, f"--decode {decode}: exited {plain['rc']}, not 2:\n{show(plain)}"
    assert len(plain["err"]) == 1, f"--decode {decode}: expected one error line:\n{show(plain)}"
    assert plain["err"][0].startswith(
        "train_amp.py: error: cannot read image imgs/train/class0/3.jpg ("), show(plain)
    assert "--skip-bad-images" in plain["err"][0], f"no fix given: {plain['err'][0]}"


def test_skip_bad_images_finishes_and_counts_the_skipped_file(corrupt_jpeg_runs):
    """--skip-bad-images should warn once naming the file and count 1 skipped per epoch."""
    decode, runs = corrupt_jpeg_runs
    skip = runs["skip"]
    assert skip["rc"] == 0, f"--decode {decode}: exited {skip['rc']}:\n{show(skip)}"
    warnings = [ln for ln in skip["err"] if "skipping unreadable image" in ln]
    assert len(warnings) == 1 and "imgs/train/class0/3.jpg" in warnings[0], (
        f"--decode {decode}: expected one warning naming the file:\n{show(skip)}")
    summaries = [ln for ln in skip["out"] if SUMMARY.match(ln)]
    assert len(summaries) == 2 and all(ln.endswith(", skipped 1 unreadable image(s)")
                                       for ln in summaries), (
        f"--decode {decode}: each epoch should report 1 skipped image:\n{show(skip)}")
    # 48 train images, 1 unreadable: the 3 batches of 16 hold 47, so accuracy is k/47.
    acc = float(re.search(r"train_acc ([\d.]+)%", summaries[0]).group(1))
    assert any(abs(acc - 100 * k / 47) < 0.006 for k in range(48)), (
        f"epoch 1 accuracy {acc}% is not a count out of 47 images: the file was not left out")


MAKE_SHARDS = r"""
import io, pathlib, tarfile
for split in ("train", "val"):
    files = sorted(pathlib.Path("imgs", split).rglob("*.jpg"))
    with tarfile.open(f"shards/{split}-000.tar", "w") as tar:
        for f in files:
            key = f"{f.parent.name}_{f.stem}"
            tar.add(f, arcname=f"{key}.jpg")
            label = str(int(f.parent.name[-1])).encode()
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = len(label)
            tar.addfile(info, io.BytesIO(label))
"""


@pytest.mark.parametrize("decode", ["workers", "device"])
def test_tar_shards_train_and_validate(run_in_image, decode):
    """Container should train on WebDataset-style tar shards (KEY.jpg + KEY.cls) and score
    the val-*.tar shards, decoding in the workers or on the device."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\nmkdir shards\n"
              f"python3 - <<'EOF'\n{MAKE_SHARDS}\nEOF\n"
              "exec train_amp.py --data shards --model resnet18 --image-size 32"
              f" --batch-size 16 --epochs 1 --num-workers 2 --lr 0.05 --decode {decode}"
              " --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "(48 train images, 2 classes, 32px)" in logs, f"shards not read:\n{logs}"
    assert re.search(r"^epoch 1/1: .* val_acc [\d.]+%", logs, re.MULTILINE), (
        f"no val accuracy from the val shard:\n{logs}")


@pytest.mark.parametrize("damage, fix", [
    # A shard cut short (an interrupted copy) was read as a shorter one: fewer images, exit 0.
    ("head -c 20000 shards/train-000.tar > cut && mv cut shards/train-000.tar",
     (r"tar shard shards/train-000\.tar ends early \(20000 bytes; its last whole member is"
     r" class\d_\d+\.(jpg|cls)\b.*copy or write it again")),
    # torchvision refuses a folder with one empty class ("Found no valid file for the classes").
    ("mkdir imgs/train/class2 imgs/val/class2 && touch imgs/train/class2/notes.txt",
     (r"1 class folder\(s\) hold no images \(imgs/train/class2; .*add their images or move"
     r" the empty folders out of it")),
], ids=["truncated-tar-shard", "empty-class-folder"])
def test_damaged_data_exits_2_naming_the_file_and_the_fix(run_in_image, damage, fix):
    """A tar shard that ends early, or an ImageFolder class folder without images, should stop
    the run at start (exit 2) naming the shard (and its last whole member) or the folder."""
    data = "shards" if "shards" in damage else "imgs"
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\nmkdir shards\n"
              f"python3 - <<'EOF'\n{MAKE_SHARDS}\nEOF\n{damage}\n"
              f"exec train_amp.py --data {data} --model resnet18 --image-size 32 --batch-size 16"
              " --epochs 1 --num-workers 1 --skip-bad-images --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 2, f"exited {code}, expected 2:\n{logs}"
    assert re.search(r"^train_amp\.py: error: --data: " + fix, logs, re.MULTILINE), (
        f"the error does not name the damage and its fix:\n{logs}")
    assert not SUMMARY.search(logs), f"it trained:\n{logs}"


def test_decode_auto_says_which_path_it_picked(run_in_image):
    """--decode auto (the default) should print the path it picked and why: workers on CPU."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --steps 1 --num-workers 1 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert re.search(r"^--decode auto: workers \(no GPU: the \d+ CPU core\(s\) decode\)$", logs,
                     re.MULTILINE), f"no line naming the picked decode path:\n{logs}"


@pytest.mark.parametrize("limit", [{"nano_cpus": 10 ** 9}, {"cpuset_cpus": "0"}],
                         ids=["cpus-1", "cpuset-cpus-0"])
def test_decode_auto_counts_the_cores_the_container_may_use(run_in_image, limit):
    """--decode auto and the default worker count should count the cores the container may use
    (docker --cpus, --cpuset-cpus), not the host's (os.cpu_count()): 1 here, on any host."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --steps 1 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script], **limit)
    assert code == 0, f"exited {code}:\n{logs}"
    assert "--decode auto: workers (no GPU: the 1 CPU core(s) decode)" in logs, (
        f"auto did not count the container's one core:\n{logs}")


# A copy of class0/0.jpg whose header says 20000 x 20000 px (PIL's decompression-bomb guard
# refuses any image over twice its 89.5 Mpx warning size when it opens it).
MAKE_HUGE = r"""python3 - <<'EOF'
data = bytearray(open("imgs/train/class0/0.jpg", "rb").read())
sof = data.index(b"\xff\xc0")  # baseline frame header: length, precision, height, width
data[sof + 5:sof + 9] = (20000).to_bytes(2, "big") * 2
open("imgs/train/class0/huge.jpg", "wb").write(data)
EOF"""


def test_a_jpeg_too_large_to_open_is_named_and_skipped_when_asked(docker_client, image_ref,
                                                                  module_containers):
    """A 20000 x 20000 px JPEG (PIL refuses it as a decompression bomb) should stop the run
    with exit 2 naming the file, and --skip-bad-images should skip it and finish (both used
    to end in a DecompressionBombError traceback)."""
    job = ["train_amp.py", "--data", "imgs", "--model", "resnet18", "--image-size", "32",
           "--batch-size", "16", "--num-workers", "2", "--epochs", "1", "--checkpoint-dir", ""]
    lines = [STEP_FN, f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF", MAKE_HUGE,
             "step plain " + shlex.join(job), "step skip " + shlex.join(job + ["--skip-bad-images"])]
    code, logs, c = run_to_end(docker_client, image_ref, ["bash", "-c", "\n".join(lines)])
    module_containers.append(c)
    assert code == 0, f"the script failed ({code}):\n{logs}"
    runs = steps_of(logs)
    plain, skip = runs["plain"], runs["skip"]
    assert plain["rc"] == 2, f"exited {plain['rc']}, not 2:\n{show(plain)}"
    assert any(re.search(r"error: cannot read image imgs/train/class0/huge\.jpg"
                         r" \(DecompressionBombError: .*pixels.*--skip-bad-images", ln)
               for ln in plain["err"]), f"the error does not name the file:\n{show(plain)}"
    assert skip["rc"] == 0, f"--skip-bad-images exited {skip['rc']}:\n{show(skip)}"
    assert any("warning: skipping unreadable image imgs/train/class0/huge.jpg" in ln
               for ln in skip["err"]), f"the skipped file is not named:\n{show(skip)}"
    assert not any("Traceback" in ln for ln in plain["err"] + skip["err"]), show(plain)


def test_a_symlink_loop_in_the_data_folder_is_named_and_counted_once(run_in_image):
    """A link back to a parent folder (`ln -s .. loop`) should be named in a warning and not
    followed: the 48 training images stay 48 (os.walk followed it until the path was too long)."""
    script = (f"python3 - <<'EOF'\n{MAKE_JPEGS}\nEOF\nln -s .. imgs/train/class0/loop\n"
              "exec train_amp.py --data imgs --model resnet18 --image-size 32 --batch-size 16"
              " --steps 1 --num-workers 1 --checkpoint-dir ''")
    code, logs = run_in_image(["bash", "-c", script])
    assert code == 0, f"exited {code}:\n{logs}"
    assert "(48 train images, 2 classes, 32px)" in logs, f"the loop was followed:\n{logs}"
    assert re.search(r"warning: --data: imgs/train/class0/loop leads back into a folder that"
                     r" contains it .*not followed", logs), f"no warning naming the loop:\n{logs}"

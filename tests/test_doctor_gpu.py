"""`make doctor`'s "which row for my GPU" (scripts/doctor_gpu.py): each host GPU's compute
capability and driver against every versions.json row's kernels and min_driver, MIG, and the
README table generated from the same data.

Host-side: a fake nvidia-smi answers the queries from files in tmp_path (test_doctor's fake
docker and host otherwise). Only test_versions_json_kernels_are_the_images starts a container.
"""
import json

import doctor_gpu  # scripts/ (conftest.py puts it on sys.path)
import pytest
import versions
from test_doctor import FakeHost, status

BLACKWELL_ROW = "2.15.0-cuda13.2"

# Answers --query-gpu=driver_version,name,compute_cap,mig.mode.current from gpus.csv, -L from
# list.txt; with the file old-driver present it refuses compute_cap as drivers before 510 do.
FAKE_SMI = r'''#!/bin/sh
here=$(dirname "$0")
case "$*" in
  *compute_cap*) [ -e "$here/old-driver" ] && { echo 'Field "compute_cap" is not a valid field to query.'; exit 2; }
                 cat "$here/gpus.csv" ;;
  *-L*) cat "$here/list.txt" ;;
  *) cut -d, -f1,2 "$here/gpus.csv" ;;
esac
'''


@pytest.fixture
def host(tmp_path):
    h = FakeHost(tmp_path)
    h.smi.write_text(FAKE_SMI)
    h.smi.chmod(0o755)
    return h


def gpus(host, *lines, listing=""):
    (host.dir / "gpus.csv").write_text("".join(line + "\n" for line in lines))
    (host.dir / "list.txt").write_text(listing)


def test_rtx_5090_on_the_default_row_is_sent_to_the_blackwell_row(host):
    """An sm_120 GPU cannot run the 2.6 row ("no kernel image"): FAIL, naming the Blackwell row."""
    gpus(host, "580.95.05, NVIDIA GeForce RTX 5090, 12.0, [N/A]")
    rc, out = host.run()
    s, row = status(out, "gpu flavour")
    assert (rc, s) == (1, "FAIL"), out
    assert "no kernels for sm_120" in row and f"make run ROW={BLACKWELL_ROW}" in row, row


def test_pascal_on_the_cuda_13_row_is_sent_to_the_default_row(host):
    """CUDA 13 has no Pascal kernels: on ROW=2.15 a P100 should FAIL and be sent to 2.6."""
    gpus(host, "580.95.05, Tesla P100-PCIE-16GB, 6.0, [N/A]")
    rc, out = host.run("doctor", "--row", BLACKWELL_ROW)
    s, row = status(out, "gpu flavour")
    assert (rc, s) == (1, "FAIL"), out
    assert "no kernels for sm_60" in row and "make run ROW=2.6.0-cuda12.4" in row, row


def test_h100_with_a_550_driver_runs_the_default_row_only(host):
    """Kernels for both rows, but the CUDA 13 row needs driver 580: OK, naming why not 2.15."""
    gpus(host, "550.54.15, NVIDIA H100 80GB HBM3, 9.0, Disabled")
    rc, out = host.run()
    s, row = status(out, "gpu flavour")
    assert (rc, s) == (0, "OK"), out
    assert "needs driver >= 580.65.06" in row and "recommended: 2.6.0-cuda12.4" in row, row
    assert "mig" not in {k for k in __import__("test_doctor").table(out)}, out


def test_mig_slices_say_what_the_container_sees(host):
    """MIG on with slices: say the container gets them all and one CUDA process uses one."""
    gpus(host, "550.54.15, NVIDIA A100-SXM4-80GB, 8.0, Enabled",
         listing="GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n"
                 "  MIG 3g.40gb     Device  0: (UUID: MIG-a)\n  MIG 3g.40gb     Device  1: (UUID: MIG-b)\n")
    _, out = host.run()
    s, row = status(out, "mig")
    assert s == "OK" and "GPU 0 (2 slices)" in row and "device_count() is 1" in row, row
    assert "device=0:0" in row, row


def test_mig_without_slices_is_a_warning(host):
    gpus(host, "550.54.15, NVIDIA A100-SXM4-80GB, 8.0, Enabled",
         listing="GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n")
    _, out = host.run()
    s, row = status(out, "mig")
    assert s == "WARN" and "no MIG device" in row and "nvidia-smi mig -cgi" in row, row


def test_driver_without_compute_cap_is_skipped_not_crashed(host):
    """Drivers before 510 refuse the compute_cap field: the driver row still works, the flavour
    row says it cannot tell."""
    gpus(host, "470.57.02, Tesla V100-SXM2-16GB, 7.0, [N/A]")
    (host.dir / "old-driver").touch()
    _, out = host.run()
    assert status(out, "gpu flavour")[0] == "SKIP", out
    assert status(out, "driver")[0] == "FAIL" and "470.57.02" in status(out, "driver")[1], out


@pytest.mark.host
def test_compute_capability_na_says_what_it_means_not_an_old_driver(host):
    """A vGPU guest's nvidia-smi answers [N/A] for compute_cap on a 535 driver: say that the driver
    does not expose it for this device and how to find it, not "driver 535 < 510?"."""
    gpus(host, "535.104.05, GRID A100-40C, [N/A], Disabled")
    _, out = host.run()
    s, row = status(out, "gpu flavour")
    assert s == "SKIP" and "reports the compute capability as [N/A]" in row, out
    assert "does not expose it for this device" in row and "get_device_capability" in row, row
    assert "< 510" not in row, row


@pytest.mark.host
def test_nvidia_smi_printing_bytes_that_are_not_utf8_still_gives_the_report(host):
    """A GPU name in another encoding (bytes that are not UTF-8): the report is printed, with the
    name as far as it decodes, instead of a UnicodeDecodeError and no report at all."""
    (host.dir / "gpus.csv").write_bytes(b"550.54.15, NVIDIA H100 80GB HBM3 \xff\xfe, 9.0, Disabled\n")
    (host.dir / "list.txt").write_bytes(b"GPU 0: NVIDIA H100 \xff (UUID: GPU-1)\n")
    _, out = host.run()
    assert status(out, "driver")[0] == "OK", out
    s, row = status(out, "gpu flavour")
    assert s == "OK" and "NVIDIA H100 80GB HBM3" in row, out


@pytest.mark.parametrize("cc,kernels,ok", [
    ("8.9", ["sm_80", "sm_86"], True),        # same major, lower minor
    ("8.0", ["sm_86"], False),                # higher minor does not run
    ("12.1", ["sm_120"], True),               # GB10 on sm_120 cubins
    ("12.0", ["sm_90"], False),               # another major
    ("12.0", ["sm_80", "compute_90"], True),  # PTX runs on newer GPUs
    ("9.0", ["sm_90a"], True),
    ("10.0", ["sm_90a"], False),
])
def test_kernel_compatibility_rules(cc, kernels, ok):
    assert doctor_gpu.runs(cc, kernels) == ok


def test_flavour_table_sends_each_generation_to_a_row_that_runs_it():
    """README's table: Blackwell to the Blackwell row, Volta to the default row, and each
    recommended row really has kernels for that capability."""
    lines = {ln.split("|")[1].strip(): ln for ln in doctor_gpu.flavour_table().splitlines()[2:]}
    assert f"`{BLACKWELL_ROW}`" in lines["Blackwell (RTX 50, RTX PRO 6000)"].split("|")[-2]
    assert "`2.6.0-cuda12.4`" in lines["Volta (V100, Titan V)"].split("|")[-2]


def test_versions_json_kernels_are_the_images(run_in_image):
    """versions.json's kernels for the image's row and platform should be what its torch has
    (the build records torch._C._cuda_getArchFlags() as cuda_arch_list)."""
    rc, out = run_in_image(["cat", "/usr/share/team-image/versions.json"])
    assert rc == 0, out
    record = json.loads(out[out.index("{"):])
    row = next(r for r in doctor_gpu.versions.DATA["matrix"] if r["name"] == record["row"])
    assert row["kernels"].get(record["platform"]) == record["cuda_arch_list"], \
        f"versions.json {row['name']} {record['platform']}: {row['kernels']}; the image: {record['cuda_arch_list']}"


def test_the_legacy_row_is_said_with_its_last_rebuild_and_the_row_to_start_on(host):
    """make doctor on the legacy row should say so, until when it is rebuilt, and which row a new project takes."""
    gpus(host, "550.54.15, NVIDIA H100 80GB HBM3, 9.0, Disabled")
    _, out = host.run()
    s, row = status(out, "row")
    legacy = versions.row(versions.DATA["default"])
    start = versions.DATA["new_projects"]
    assert legacy.get("legacy") and s == "OK", out
    assert f"{legacy['name']} is the legacy row: rebuilt weekly until {legacy['rebuilds_until']}" in row, row
    assert f"A new project should start on {start}: ROW={start}" in row, row
    _, out = host.run("doctor", "--row", start)
    assert f"{start}: the row new projects start on" in status(out, "row")[1], out

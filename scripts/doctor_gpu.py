"""Which versions.json rows can run on this host's GPUs: each row's kernels (versions.json
`kernels`, per platform: what torch._C._cuda_getArchFlags() lists in its wheel) against each
GPU's compute capability, and its min_driver against the driver. Used by `make doctor`
(scripts/doctor.py) and for README's "Which flavour for your GPU" table (scripts/generate.py).
"""
import re

import versions
from doctor_report import FAIL, OK, SKIP, WARN, Row

# GPU families for README's table: (what a user knows the GPU as, compute capability).
FAMILIES = [
    ("Maxwell (GTX 900, M40)", "5.2"),
    ("Pascal (GTX 10, P100)", "6.0"),
    ("Volta (V100, Titan V)", "7.0"),
    ("Turing (RTX 20, T4)", "7.5"),
    ("Ampere (A100, A30)", "8.0"),
    ("Ampere (RTX 30, A10, A40)", "8.6"),
    ("Ada (RTX 40, L4, L40S)", "8.9"),
    ("Hopper (H100, H200)", "9.0"),
    ("Blackwell (B200, GB200)", "10.0"),
    ("Blackwell (RTX 50, RTX PRO 6000)", "12.0"),
    ("Blackwell (DGX Spark GB10)", "12.1"),
]


def sm(cc):
    """'8.9' -> (8, 9); None for '[N/A]' or empty."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", cc or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def runs(cc, kernels):
    """True when a cubin of the GPU's major with a minor not above its own (sm_86 on an 8.9 GPU)
    or PTX (compute_XY) not above its capability is in kernels. An arch-specific cubin (sm_90a)
    runs on that capability only."""
    want = sm(cc)
    for k in kernels:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([af]?)", k)
        if not m or not want:
            continue
        have = (int(m.group(2)), int(m.group(3)))
        if m.group(1) == "compute" and have <= want:
            return True
        if m.group(1) == "sm" and (have == want if m.group(4) else have[0] == want[0] and have[1] <= want[1]):
            return True
    return False


def version(text):
    return tuple(int(n) for n in re.findall(r"\d+", text or "")) or (0,)


def row_fit(r, cc, driver, platform="linux/amd64"):
    """(True, '') when row r runs on a GPU of capability cc with this driver, else (False, why)."""
    kernels = r.get("kernels", {}).get(platform)
    if kernels is None:
        return False, f"not built for {platform}"
    if not runs(cc, kernels):
        return False, f"no kernels for sm_{cc.replace('.', '')} (it has {' '.join(kernels)}: 'no kernel image is available')"
    if driver and version(driver) < version(r["min_driver"]):
        return False, f"needs driver >= {r['min_driver']}"
    return True, ""


def recommend(fits):
    """The row to use among those that fit: the default row (`latest`) when it is one, else the
    newest torch."""
    if not fits:
        return None
    default = [r for r in fits if r["name"] == versions.DATA["default"]]
    return default[0] if default else max(fits, key=lambda r: version(r["torch"]))


def tag_hint(r):
    """How a user names row r: its moving tag and make's ROW."""
    tags = r.get("moving_tags") or []
    return f"ROW={r['name']}" + (f" (tag {tags[-1]})" if tags else "")


def parse_smi(out):
    """nvidia-smi --query-gpu=driver_version,name,compute_cap,mig.mode.current lines as dicts;
    an older driver's answer without compute_cap/MIG gives '' for them."""
    gpus = []
    for line in out.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 2:
            gpus.append({"driver": f[0], "name": f[1], "cc": f[2] if len(f) > 2 else "",
                         "mig": f[3] if len(f) > 3 else ""})
    return gpus


def mig_slices(listing):
    """{GPU index: number of MIG devices} from `nvidia-smi -L`."""
    count, gpu = {}, None
    for line in listing.splitlines():
        m = re.match(r"GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
            count[gpu] = 0
        elif line.strip().startswith("MIG ") and gpu is not None:
            count[gpu] += 1
    return count


def check_row_support(row):
    """doctor's row: whether make run's row is the legacy one, until when it is rebuilt, and the
    row a new project should start on (versions.json legacy, rebuilds_until, new_projects)."""
    sup = versions.support(row)
    until = sup["rebuilds_until"] or "no end set yet"
    if sup["legacy"]:
        start = versions.row(sup["new_projects"])
        return [Row(OK, "row", f"{row['name']} is the legacy row: rebuilt weekly until {until}, then frozen. "
                               f"A new project should start on {start['name']}: {tag_hint(start)}")]
    if row["name"] == sup["new_projects"]:
        return [Row(OK, "row", f"{row['name']}: the row new projects start on; rebuilt weekly ({until})")]
    return [Row(OK, "row", f"{row['name']}: rebuilt weekly until {until}; new projects start on {sup['new_projects']}")]


def check_gpu_rows(gpus, row, platform, mig_listing=None):
    """doctor's rows: per distinct GPU model, which rows run on it and which is recommended
    (FAIL when make run's row cannot); per MIG-enabled GPU, what the container sees."""
    if not gpus:
        return [Row(SKIP, "gpu flavour", "no GPU listed by nvidia-smi: any row runs on the CPU")]
    out, seen = [], set()
    for g in gpus:
        if (g["name"], g["cc"]) in seen:
            continue
        seen.add((g["name"], g["cc"]))
        if not sm(g["cc"]):
            out.append(Row(SKIP, "gpu flavour", no_capability(g)))
            continue
        verdicts = {r["name"]: row_fit(r, g["cc"], g["driver"], platform) for r in versions.DATA["matrix"]}
        fits = [r for r in versions.DATA["matrix"] if verdicts[r["name"]][0]]
        best = recommend(fits)
        said = "; ".join(f"{n}: {'runs' if ok else why}" for n, (ok, why) in verdicts.items())
        finding = f"{g['name']} (sm_{g['cc'].replace('.', '')}, driver {g['driver']}): {said}"
        if verdicts[row["name"]][0]:
            out.append(Row(OK, "gpu flavour", finding + f"; recommended: {best['name']}"))
        elif best:
            out.append(Row(FAIL, "gpu flavour", finding + f"; make run's row {row['name']} cannot use it",
                           f"use {best['name']}: make run {tag_hint(best)}"))
        else:
            out.append(Row(FAIL, "gpu flavour", finding + "; no row runs on it",
                           "upgrade the driver to the newest row's min_driver, or use a PyTorch build "
                           "with kernels for this GPU"))
    out += check_mig(gpus, mig_listing)
    return out


def no_capability(g):
    """Why doctor cannot say which row runs on g: the field is missing (a driver before 510 has
    no compute_cap query), or nvidia-smi answers [N/A] (it has no value for this device: a vGPU
    guest's, or a GPU whose driver does not report it), which says nothing about the driver."""
    if g["cc"].strip().strip("[]").upper() in ("N/A", "NOT SUPPORTED", "UNKNOWN ERROR"):
        return (f"{g['name']}: nvidia-smi reports the compute capability as {g['cc']}: the driver ({g['driver']}) "
                "does not expose it for this device (a vGPU or passthrough guest, or a GPU it does not fully "
                "know), so doctor cannot tell which row has kernels for it: find the model in README's Which "
                "flavour for your GPU, or in the container: python -c 'import torch; "
                "print(torch.cuda.get_device_capability())'")
    return (f"{g['name']}: nvidia-smi gives no compute capability (driver {g['driver']} < 510 has no "
            "compute_cap query): see README's Which flavour for your GPU")


def check_mig(gpus, listing):
    on = [i for i, g in enumerate(gpus) if g["mig"].lower() == "enabled"]
    if not on:
        return []
    slices = mig_slices(listing or "")
    total = sum(slices.get(i, 0) for i in on)
    which = ", ".join(f"GPU {i} ({slices.get(i, 0)} slices)" for i in on)
    if not total:
        return [Row(WARN, "mig", f"MIG is on ({which}) but no MIG device exists: a container "
                    "sees no CUDA device on those GPUs",
                    [("create instances, e.g.: sudo nvidia-smi mig -cgi 1g.10gb -C (nvidia-smi mig -lgip "
                      "lists the profiles), or turn MIG off: sudo nvidia-smi -i 0 -mig 0")])]
    return [Row(OK, "mig", f"MIG is on: {which}. With --gpus all the container gets every MIG "
                "device, but one CUDA process uses only the first (torch.cuda.device_count() is 1); "
                "give each container or process one slice",
                [("docker run --gpus '\"device=0:0\"' ... (GPU 0, MIG device 0), or "
                  "CUDA_VISIBLE_DEVICES=MIG-<uuid> from nvidia-smi -L")])]


def flavour_table():
    """README's "Which flavour for your GPU" table (Markdown), from versions.json."""
    rows = versions.DATA["matrix"]
    head = "| Your GPU | Compute capability | " + " | ".join(f"`{r['name']}`" for r in rows) + " | Use |\n"
    head += "|---|---|" + "---|" * len(rows) + "---|\n"
    body = ""
    for family, cc in FAMILIES:
        cells, fits = [], []
        for r in rows:
            plats = [p for p in r["platforms"] if runs(cc, r.get("kernels", {}).get(p, []))]
            cells.append("yes" + ("" if plats == r["platforms"] else f" ({', '.join(p.split('/')[1] for p in plats)})")
                         if plats else "no")
            fits += [r] if plats else []
        best = recommend(fits)
        use = f"`{best['name']}` (`{(best.get('moving_tags') or [best['name']])[-1]}`)" if best else "none"
        body += f"| {family} | {cc} | " + " | ".join(cells) + f" | {use} |\n"
    return head + body


def driver_floor_line():
    return "; ".join(f"`{r['name']}` needs driver >= {r['min_driver']}" for r in versions.DATA["matrix"])

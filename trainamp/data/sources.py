"""The data sets: synthetic and digits (in memory), an ImageFolder, and WebDataset-style tar
shards indexed once and read by random access; with the checks that name a damaged file."""
import enum
import io
import os
import pathlib
import tarfile

import torch
import torchvision
from torch.utils.data import Dataset

from ..errors import UsageError, error_text
from .bad import BadSample
from .cpu import image_transforms, open_image
from .options import DEFAULT


class SampleFormat(enum.Enum):
    """What a data source's DataLoader yields, and so what to_device() still has to do."""
    LOW_RES = "small float images in memory (digits, synthetic): upscaled on the device"
    DECODED = "uint8 images decoded and augmented by the DataLoader workers (ImageFolder)"
    JPEG_BYTES = "undecoded JPEG files (--decode device): decoded and augmented on the device"
    ON_DEVICE = "JPEG_BYTES batches DeviceBatches already decoded, augmented and normalised"


class LowResDataset(Dataset):
    """Small float images kept in memory, upscaled on the device (digits and synthetic)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def digits_split():
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # 1797 x 1 x 8 x 8
    y = torch.tensor(digits.target, dtype=torch.int64)
    # A fixed split (not --seed) so every run, FP32 or AMP, is scored on the same images. 40%
    # (719 images) for validation: with 20% one image is 0.28 points and two equally good
    # models often differ by more than a point by chance alone.
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    n_val = len(y) * 2 // 5
    val, train = perm[:n_val], perm[n_val:]
    return LowResDataset(x[train], y[train]), LowResDataset(x[val], y[val])


def synthetic_split(n_train, num_classes, seed):
    """Class-dependent low-res patterns plus noise: a learnable task, made in memory."""
    g = torch.Generator().manual_seed(10_000 + seed)
    patterns = torch.randn(num_classes, 3, 8, 8, generator=g)

    def make(n):
        y = torch.randint(num_classes, (n,), generator=g)
        # Scaled to the digits' range (mean 0.5, about 0.25 spread): to_device() normalises both.
        x = 0.5 + 0.2 * (patterns[y] + 0.8 * torch.randn(n, 3, 8, 8, generator=g))
        return LowResDataset(x, y)

    return make(n_train), make(max(256, n_train // 8))


def walk_without_loops(top, loops):
    """os.walk(top, followlinks=True) as [(folder, file names)], sorted as torchvision sorts
    it, except that a link to a folder that contains where the walk is (`ln -s .. loop`) is
    not entered but added to `loops`. os.walk follows such a link until the path is too long:
    nine images then counted as thousands, each a copy of the same files."""
    found = []

    def visit(path, ancestors):
        real = os.path.realpath(path)
        if any(a == real or a.startswith(real.rstrip(os.sep) + os.sep) for a in ancestors):
            loops.append(path)
            return
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:  # os.walk skips an unreadable folder too
            return
        found.append((path, [e.name for e in entries if not e.is_dir()]))
        for entry in entries:
            if entry.is_dir():  # follows symlinks, as os.walk(followlinks=True)
                visit(entry.path, ancestors | {real})

    visit(top, frozenset())
    return sorted(found)


class CheckedImageFolder(torchvision.datasets.ImageFolder):
    """ImageFolder that returns BadSample(path, reason) for a file it cannot load, and does not
    follow symlink loops (self.loops names them)."""

    def __init__(self, *args, **kwargs):
        self.loops = []
        super().__init__(*args, **kwargs)

    def make_dataset(self, directory, class_to_idx, extensions=None, is_valid_file=None,
                     allow_empty=False):
        """torchvision's make_dataset (same samples, same order) over walk_without_loops."""
        if is_valid_file is None:
            def is_valid_file(path):
                return torchvision.datasets.folder.has_file_allowed_extension(path, extensions)
        samples, empty = [], []
        for name in sorted(class_to_idx):
            before = len(samples)
            for folder, files in walk_without_loops(os.path.join(directory, name), self.loops):
                samples += [(p, class_to_idx[name]) for p in (os.path.join(folder, f)
                                                               for f in sorted(files))
                            if is_valid_file(p)]
            if len(samples) == before:
                empty.append(name)
        if empty and not allow_empty:
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(empty)}")
        return samples

    def __getitem__(self, i):
        try:
            return super().__getitem__(i)
        except Exception as e:  # noqa: BLE001 - whatever PIL or a transform raises, the file is unusable
            return BadSample(self.samples[i][0], error_text(e))


class FileBytes(Dataset):
    """An ImageFolder's files, undecoded: for --decode device the workers only read files."""

    def __init__(self, folder):
        self.samples, self.classes = folder.samples, folder.classes

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        try:
            return torchvision.io.read_file(path), label, path
        except Exception as e:  # noqa: BLE001 - an unreadable file, named by the main process
            return BadSample(path, error_text(e))

JPEG_SUFFIXES = (".jpg", ".jpeg")

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class TarShards(Dataset):
    """WebDataset-style tar shards read by random access: each sample is the members that share
    a key (the file name up to its first dot), an image (KEY.jpg/.jpeg/.png...) and its class
    index (KEY.cls, a decimal integer). The shards are indexed once at start (tar headers
    only), then every sample is one pread() of its bytes: the same sampler, shuffling, resume
    and decode paths as an ImageFolder. With decode 'device' a sample is its undecoded bytes
    (like FileBytes), else a PIL image through transform (like CheckedImageFolder)."""

    def __init__(self, shards, transform=None, raw=False):
        self.transform, self.raw, self._fds = transform, raw, {}
        self.shards = [str(s) for s in shards]
        self.samples, labels = [], []
        for si, shard in enumerate(self.shards):
            members = {}
            try:
                with tarfile.open(shard, "r:") as tar:
                    try:
                        for m in tar:
                            if not m.isfile():
                                continue
                            base = m.name.rsplit("/", 1)[-1]
                            key, _, ext = base.partition(".")
                            members.setdefault(m.name[:len(m.name) - len(base)] + key, {})[
                                "." + ext.lower()] = (m.offset_data, m.size)
                    except tarfile.ReadError as e:  # e.g. "unexpected end of data"
                        raise cut_short(shard, tar, error_text(e)) from None
                    if not tar_ends_whole(tar):
                        raise cut_short(shard, tar)
                    for key, parts in members.items():
                        img = next((e for e in IMAGE_SUFFIXES if e in parts), None)
                        if img is None or ".cls" not in parts:
                            continue
                        tar.fileobj.seek(parts[".cls"][0])
                        label = int(tar.fileobj.read(parts[".cls"][1]).decode().strip())
                        self.samples.append((si, *parts[img], f"{shard}:{key}{img}", label))
                        labels.append(label)
            except (OSError, tarfile.TarError, ValueError) as e:
                raise UsageError(f"--data: cannot index tar shard {shard} ({error_text(e)}):"
                                 " each sample needs KEY.jpg (or .png ...) and KEY.cls (its"
                                 " class index)") from None
        if not self.samples:
            raise UsageError(f"--data: no samples in {len(self.shards)} tar shard(s): each"
                             " sample needs KEY.jpg (or .png ...) and KEY.cls (its class index)")
        self.num_classes = max(labels) + 1
        self.classes = [str(i) for i in range(self.num_classes)]
        self.targets = labels

    def __len__(self):
        return len(self.samples)

    def _read(self, shard, offset, size):
        # One descriptor per shard and process (DataLoader workers each open their own);
        # pread has no shared file position, so forked copies never disturb each other.
        key = (os.getpid(), shard)
        if key not in self._fds:
            self._fds[key] = os.open(self.shards[shard], os.O_RDONLY)
        data = os.pread(self._fds[key], size, offset)
        if len(data) != size:
            raise OSError(f"short read: {len(data)} of {size} bytes")
        return data

    def __getitem__(self, i):
        shard, offset, size, name, label = self.samples[i]
        try:
            data = self._read(shard, offset, size)
            if self.raw:
                return torch.frombuffer(bytearray(data), dtype=torch.uint8), label, name
            from PIL import Image
            img = Image.open(io.BytesIO(data))  # decoded by the transform (draft_jpeg)
            return (self.transform(img) if self.transform else img.convert("RGB")), label
        except Exception as e:  # noqa: BLE001 - the sample is unusable, named by the main process
            return BadSample(name, error_text(e))


def tar_ends_whole(tar):
    """Whether an archive read to its end really ends there: tarfile reads a cut archive as a
    shorter one and says nothing (the run would train on fewer images). A whole one has a zero
    block where its members end."""
    end = os.pread(tar.fileobj.fileno(), tarfile.BLOCKSIZE, tar.offset)
    return len(end) == tarfile.BLOCKSIZE and not any(end)


def cut_short(shard, tar, reason=None):
    """The UsageError for a shard that ends early (an interrupted copy or write), naming its
    last whole member: the members read so far whose data lies inside the file."""
    size = os.fstat(tar.fileobj.fileno()).st_size
    whole = [m.name for m in tar.members if m.offset_data + m.size <= size]
    last = f"its last whole member is {whole[-1]}" if whole else "no member is whole"
    return UsageError(f"--data: tar shard {shard} ends early ({size} bytes; {last}"
                      f"{'; ' + reason if reason else ''}): it was cut short (an interrupted"
                      " copy or write?): copy or write it again, or move it out of the data"
                      " directory")


def tar_shards(root):
    """-> (train shards, val shards) when root holds .tar files (directly, where val*.tar are
    the validation shards, or in train/ and val/), else None."""
    root = pathlib.Path(root)
    if sorted(root.glob("*.tar")):
        tars = sorted(root.glob("*.tar"))
        return ([t for t in tars if not t.name.startswith("val")],
                [t for t in tars if t.name.startswith("val")])
    if sorted((root / "train").glob("*.tar")):
        return sorted((root / "train").glob("*.tar")), sorted((root / "val").glob("*.tar"))
    return None


def check_class_folders(folder):
    """An ImageFolder's class subfolders that hold no image make torchvision refuse the whole
    folder ("Found no valid file for the classes ..."): name them and the fix instead. Nothing
    to say when no class has images (the caller's "no images found" says that)."""
    if folder is None or not folder.is_dir():
        return
    classes = sorted(d for d in folder.iterdir() if d.is_dir())  # as torchvision: hidden too
    empty = [d for d in classes if not any(
        f.suffix.lower() in IMAGE_SUFFIXES for f in d.rglob("*") if f.is_file())]
    if empty and len(empty) < len(classes):
        names = ", ".join(str(d) for d in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise UsageError(f"--data: {len(empty)} class folder(s) hold no images ({names};"
                         f" images end in {', '.join(IMAGE_SUFFIXES[:3])} ...): every"
                         f" subfolder of {folder} is a class, so add their images or move the"
                         " empty folders out of it")


class ImageFolderData:
    """An ImageFolder (class subfolders; train/ and val/ if there) or tar shards, for --decode
    workers (decoded + augmented in the DataLoader workers) or device (workers read bytes)."""

    def __init__(self, root, image_size, decode="workers", options=DEFAULT):
        root = pathlib.Path(root)
        train_tf, val_tf = image_transforms(image_size, options)
        shards = tar_shards(root)
        if shards:
            raw = decode == "device"
            self.train = TarShards(shards[0], train_tf, raw)
            self.val = TarShards(shards[1], val_tf, raw) if shards[1] else None
            self.classes = self.train.classes
            if self.val is not None and self.val.num_classes > len(self.classes):
                self.classes = self.val.classes
            self.paths = [s[3] for s in self.train.samples]
            self.loops = []
            return
        train_dir, val_dir = (root / "train", root / "val") if (root / "train").is_dir() else (
            root, None)
        for folder in (train_dir, val_dir):
            check_class_folders(folder)
        try:
            self.train = CheckedImageFolder(str(train_dir), transform=train_tf, loader=open_image)
            self.val = (CheckedImageFolder(str(val_dir), transform=val_tf, loader=open_image)
                        if val_dir and val_dir.is_dir() else None)
        except (FileNotFoundError, OSError) as e:
            raise UsageError(f"--data {root}: no images found ({e}); an ImageFolder needs"
                             " class subfolders holding .jpg/.png files, or give a directory"
                             " of .tar shards (KEY.jpg + KEY.cls per sample)") from None
        self.classes = self.train.classes
        self.paths = [s[0] for s in self.train.samples]
        self.loops = self.train.loops + (self.val.loops if self.val is not None else [])
        if decode == "device":
            self.to_bytes()

    def to_bytes(self):
        """For --decode device: the workers only read the files."""
        if isinstance(self.train, TarShards):
            for ds in (self.train, self.val):
                if ds is not None:
                    ds.raw = True
            return
        self.train = FileBytes(self.train)
        self.val = FileBytes(self.val) if self.val is not None else None

"""An eStargz layer's table of contents (TOC), read and checked the way the stargz snapshotter does
before it mounts a layer lazily: the 51-byte gzip footer names the TOC's offset, the TOC is a gzip
member holding a tar entry stargz.index.json, and the sha256 of that JSON must be the layer's
`containerd.io/snapshot/stargz/toc.digest` annotation. With the whole blob, every chunk's digest
is checked against its bytes too. make push ESGZ=1 reads back each pushed layer's TOC with
toc_of_remote_layer (ranged GETs: kilobytes, not the layer).

Format: github.com/containerd/stargz-snapshotter docs/estargz.md (Debian's library: estargz/gzip.go).
"""
import gzip
import hashlib
import io
import itertools
import json
import struct
import tarfile
import zlib

FOOTER_SIZE = 51
TOC_NAME = "stargz.index.json"
ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"


class TOCError(Exception):
    pass


def toc_offset(footer):
    """The TOC's offset in the blob, from the footer: an empty gzip member whose header's extra
    field is 'SG' + len + '%016x' % offset + 'STARGZ'."""
    if len(footer) != FOOTER_SIZE or footer[:2] != b"\x1f\x8b" or not footer[3] & 0x04:
        raise TOCError("no eStargz footer at the layer's end: not an eStargz layer")
    xlen = struct.unpack_from("<H", footer, 10)[0]
    extra = footer[12:12 + xlen]
    if extra[:2] != b"SG" or struct.unpack_from("<H", extra, 2)[0] != 22 or extra[20:26] != b"STARGZ":
        raise TOCError("the layer's footer has no STARGZ field: not an eStargz layer")
    return int(extra[4:20], 16)


def toc_json(member):
    """The TOC's JSON bytes from its gzip member (the bytes from the TOC offset to the footer)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(member))) as tar:
            entry = tar.next()
            if entry is None or entry.name != TOC_NAME:
                raise TOCError(f"the TOC member holds {entry and entry.name!r}, not {TOC_NAME}")
            return tar.extractfile(entry).read()
    except (OSError, EOFError, tarfile.TarError, zlib.error) as e:
        raise TOCError(f"the TOC is not a readable gzip'd tar ({e})") from None


def check_digest(json_bytes, expected):
    actual = "sha256:" + hashlib.sha256(json_bytes).hexdigest()
    if actual != expected:
        raise TOCError(f"the TOC's digest is {actual[:19]}, but the manifest says {expected[:19]}: "
                       "a TOC that does not match its layer is refused")
    return json.loads(json_bytes)


def verify_blob(blob, expected):
    """A whole eStargz blob against its annotation: the TOC digest, then each chunk's bytes.
    -> the TOC (dict); TOCError on the first mismatch."""
    offset = toc_offset(blob[-FOOTER_SIZE:])
    toc = check_digest(toc_json(blob[offset:-FOOTER_SIZE]), expected)
    chunks = [e for e in toc.get("entries", []) if e.get("type") in ("reg", "chunk") and e.get("chunkDigest")]
    # Each chunk is a gzip member of its own, from its offset to the next chunk's (or the TOC).
    starts = sorted({e["offset"] for e in chunks} | {offset})
    ends = dict(itertools.pairwise(starts))
    view = memoryview(blob)
    file_size = 0
    for entry in chunks:
        # A "reg" entry starts a file (its size); its "chunk" entries follow. chunkSize 0: to the end.
        file_size = entry.get("size", 0) if entry["type"] == "reg" else file_size
        size = entry.get("chunkSize") or file_size - entry.get("chunkOffset", 0)
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(view[entry["offset"]:ends[entry["offset"]]], size)
        if "sha256:" + hashlib.sha256(data).hexdigest() != entry["chunkDigest"]:
            raise TOCError(f"{entry['name']}: its bytes do not match the TOC's chunk digest: refused")
    return toc


def toc_of_remote_layer(client, layer):
    """Read a pushed layer's footer and TOC with ranged GETs and check the TOC against the layer's
    annotation. client: scripts/registry.py's Client. -> the TOC; TOCError on a mismatch."""
    expected = layer.get("annotations", {}).get(ANNOTATION)
    if not expected:
        raise TOCError(f"layer {layer['digest'][:19]} has no {ANNOTATION} annotation")
    size = layer["size"]

    def ranged(start, end):
        status, _, body = client.request("GET", f"blobs/{layer['digest']}", {"Range": f"bytes={start}-{end}"})
        if status != 206:  # a whole layer answered: fine for the check, but say it was not ranged
            body = body[start:end + 1]
        return body
    offset = toc_offset(ranged(size - FOOTER_SIZE, size - 1))
    return check_digest(toc_json(ranged(offset, size - FOOTER_SIZE - 1)), expected)

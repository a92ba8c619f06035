"""--decode device's crop kernel: crop, resize, flip and normalise a whole batch of decoded
images in one Triton kernel (data/device.py's crop_to_batch launches it)."""
try:  # without Triton crop_to_batch takes its roi_align path
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

_crop_kernel = None
if triton is not None:
    @triton.jit
    def _tap(base, off, wt, m):
        return tl.load(base + off, mask=m, other=0).to(tl.float32) * wt

    @triton.jit
    def _edge(pos, size):
        """roi_align's bilinear sample along one axis of `size` pixels: -> (the pixel at or
        before pos, the one after, the weight of the one after); clamped to the edge pixel."""
        pos = tl.maximum(pos, 0.0)
        lo = pos.to(tl.int32)
        last = lo >= size - 1
        lo = tl.where(last, size - 1, lo)
        return lo, tl.where(last, size - 1, lo + 1), tl.where(last, 0.0, pos - lo.to(tl.float32))

    @triton.jit
    def _crop_kernel(src, meta, boxes, out, s_n, s_c, s_y, s_x, shift0, shift1, shift2,
                     scale0, scale1, scale2, S: tl.constexpr, BLOCK: tl.constexpr):
        """crop_to_batch on a GPU. Program (n, k): output pixels k*BLOCK.. of image n. Each
        output pixel averages a ceil(bin) x ceil(bin) grid of bilinear samples of its bin,
        exactly as torchvision's roi_align(aligned=True, sampling_ratio=-1) does (an area
        filter when shrinking, bilinear when enlarging), edges clamped as there."""
        n = tl.program_id(0)
        pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = pix < S * S
        oy = pix // S
        ox = pix % S
        start = tl.load(meta + 4 * n)
        h = tl.load(meta + 4 * n + 1).to(tl.int32)
        w = tl.load(meta + 4 * n + 2).to(tl.int32)
        flip = tl.load(meta + 4 * n + 3)
        hf, wf = h.to(tl.float32), w.to(tl.float32)
        x1, y1 = tl.load(boxes + 4 * n), tl.load(boxes + 4 * n + 1)
        x2, y2 = tl.load(boxes + 4 * n + 2), tl.load(boxes + 4 * n + 3)
        sx = tl.where(flip != 0, S - 1 - ox, ox).to(tl.float32)
        sy = oy.to(tl.float32)
        bin_w, bin_h = (x2 - x1) / S, (y2 - y1) / S
        gw = tl.maximum(tl.ceil(bin_w).to(tl.int32), 1)
        gh = tl.maximum(tl.ceil(bin_h).to(tl.int32), 1)
        plane = h.to(tl.int64) * w
        c0 = src + start
        c1 = c0 + plane
        c2 = c1 + plane
        acc0 = tl.zeros([BLOCK], tl.float32)
        acc1 = tl.zeros([BLOCK], tl.float32)
        acc2 = tl.zeros([BLOCK], tl.float32)
        # while, not range(gh): Triton's interpreter (the CPU tests) cannot range over a
        # loaded value.
        iy = 0
        while iy < gh:
            y = y1 - 0.5 + sy * bin_h + (iy + 0.5) * bin_h / gh
            yin = (y >= -1.0) & (y <= hf)
            ya, yb, ly = _edge(y, h)
            ix = 0
            while ix < gw:
                x = x1 - 0.5 + sx * bin_w + (ix + 0.5) * bin_w / gw
                m = valid & yin & (x >= -1.0) & (x <= wf)
                xa, xb, lx = _edge(x, w)
                w00, w01 = (1 - ly) * (1 - lx), (1 - ly) * lx
                w10, w11 = ly * (1 - lx), ly * lx
                p00, p01, p10, p11 = ya * w + xa, ya * w + xb, yb * w + xa, yb * w + xb
                acc0 += (_tap(c0, p00, w00, m) + _tap(c0, p01, w01, m)
                         + _tap(c0, p10, w10, m) + _tap(c0, p11, w11, m))
                acc1 += (_tap(c1, p00, w00, m) + _tap(c1, p01, w01, m)
                         + _tap(c1, p10, w10, m) + _tap(c1, p11, w11, m))
                acc2 += (_tap(c2, p00, w00, m) + _tap(c2, p01, w01, m)
                         + _tap(c2, p10, w10, m) + _tap(c2, p11, w11, m))
                ix += 1
            iy += 1
        count = (gh * gw).to(tl.float32)
        dst = out + n * s_n + oy * s_y + ox * s_x
        tl.store(dst, acc0 / count * scale0 + shift0, mask=valid)
        tl.store(dst + s_c, acc1 / count * scale1 + shift1, mask=valid)
        tl.store(dst + 2 * s_c, acc2 / count * scale2 + shift2, mask=valid)

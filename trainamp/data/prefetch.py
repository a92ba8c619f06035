"""--decode device's prefetch: one thread decodes and augments batches on a side CUDA stream
ahead of training (DeviceBatches), over one loader pass for the whole job (PlanBatches)."""
import copy
import queue
import threading

import torch

from .device import batch_generator, decode_on_device
from .options import DEFAULT

# Batches decoded ahead of training on the GPU: enough to ride out one slow batch and the
# start of the next epoch's loader iteration (each is 154 MB at 256 x 224 px).
PREFETCH_BATCHES = 4


class PendingBadImages(list):
    """Unreadable files of a batch decoded ahead, reported when the batch is trained on (to the
    epoch it belongs to, not the one running when it was decoded)."""

    def report(self, bad):
        self.extend(bad)


class PlanBatches:
    """Batch sampler over every pass of a job: the batches of its (epoch, first batch) passes
    one after the other, as the trainer's loader gives each epoch (the sampler's order for that
    epoch, from batch `first`, whole batches only), so that one DataLoader iteration spans the
    job and its workers read on across epoch ends. A new iteration per epoch restarted them:
    the next epoch's first batches came late (about 0.1-0.2 s an epoch on an H200, 0.4 s when
    the workers also decode). Each pass draws its order from a copy of the sampler: the trainer
    sets the epoch on its own one, maybe while this runs ahead. lengths: batches per pass."""

    def __init__(self, sampler, batch_size, plan):
        self.sampler, self.batch_size, self.plan = sampler, batch_size, list(plan)
        self.lengths = [(self.sampler.num_samples - first * batch_size) // batch_size
                        for _, first in self.plan]

    def __iter__(self):
        for (epoch, first), n in zip(self.plan, self.lengths):
            sampler = copy.copy(self.sampler)
            sampler.set_epoch(epoch)
            sampler.start = first * self.batch_size
            order = list(sampler)
            for b in range(n):
                yield order[b * self.batch_size:(b + 1) * self.batch_size]

    def __len__(self):
        return sum(self.lengths)


class DeviceBatches:
    """--decode device batches, decoded, augmented and normalised on the GPU by one thread of
    their own up to PREFETCH_BATCHES ahead, on a side CUDA stream: decode and crop overlap the
    model and the training loop never waits for them on the host. The thread iterates the
    loader once; plan: the passes it makes of it, in order, as (epoch, first batch, batches);
    it goes from one pass straight on to the next, so an epoch starts with its first batches
    ready (PlanBatches makes such a loader for the whole job). The crops of batch k of epoch e
    come from a generator seeded with (seed, e, k): the same whatever the prefetch depth, and a
    resumed epoch draws what the uninterrupted one drew. Iterating the object itself makes its
    (single) pass. options: the DecodeOptions of the decode and crop."""

    def __init__(self, loader, image_size, device, channels_last, train, bad_images,
                 plan=None, seed=0, options=DEFAULT):
        self.loader, self.image_size, self.device = loader, image_size, device
        self.channels_last, self.train, self.bad_images = channels_last, train, bad_images
        self.plan, self.seed = list(plan or [(0, 0, len(loader))]), seed
        self.options = options
        self.queue, self.stopping, self.worker, self.inline = None, threading.Event(), None, None

    def prepare(self, epoch, k, x, y):
        gen = (batch_generator((self.seed * 1000 + epoch) * 1_000_003 + k) if self.train
               else None)
        bad = PendingBadImages()
        x, keep = decode_on_device(x, self.train, self.image_size, self.device, bad, gen,
                                   self.channels_last, self.options)
        y = y[list(keep)] if len(keep) != len(y) else y
        return x, y.to(self.device, non_blocking=True), bad

    def passes(self):
        """(epoch, batch or None at the end of its pass) for every pass of the plan."""
        batches = iter(self.loader)
        for epoch, first, n in self.plan:
            for k, (x, y) in zip(range(first, first + n), batches):
                yield epoch, self.prepare(epoch, k, x, y)
            yield epoch, None

    def __iter__(self):
        return self.epoch(self.plan[0][0])

    def epoch(self, epoch):
        """The batches (images, labels) of the plan's next pass, which must be this epoch's."""
        if self.device.type != "cuda":
            self.inline = self.inline or self.passes()  # no thread: prepared when asked for
            items = self.inline
        else:
            if self.worker is None:
                self._start()
            items = iter(self._take, ())
        for pass_epoch, batch in items:
            if pass_epoch != epoch:
                raise RuntimeError(f"DeviceBatches: epoch {epoch} asked, {pass_epoch} prepared")
            if batch is None:
                if self.inline is not None and pass_epoch == self.plan[-1][0]:
                    # The plan is done: end the generator now, which drops the loader's
                    # iterator and so shuts its workers down here and now. Left in its cycle
                    # (the generator holds self, self holds it), the iterator lived on, workers
                    # and all, until the garbage collector ran its __del__ - once inside a
                    # worker that a later DataLoader had forked, which broke that loader's
                    # pipes: its next batch never came (EOFError) and the run died (seen in CI
                    # on CPU, in validation, after two epochs).
                    self.close()
                return
            x, y, bad = batch
            self.bad_images.report(bad)
            yield x, y

    def _take(self):
        item = self.queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        pass_epoch, batch, ready = item
        if batch is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_event(ready)  # the GPU waits, not the host
            # Allocated on the side stream, used on the main one: not reusable before that.
            batch[0].record_stream(main)
            batch[1].record_stream(main)
        return pass_epoch, batch

    def _start(self):
        # A thread of its own: nvJPEG holds the calling thread until its batch is decoded (and
        # behind the queued training work), which on the training thread left the GPU idle
        # for that time each step (3,474 images/s vs 6,648 synthetic on an H200). The thread
        # drops the GIL inside decode and the copies; its kernels go on a high-priority side
        # stream so they slot in between the model's.
        self.queue = queue.Queue(maxsize=PREFETCH_BATCHES)

        def produce():
            # Everything inside the try: a thread that died before its first put (a failed
            # set_device or stream) left the training thread waiting on the queue for ever.
            try:
                torch.cuda.set_device(self.device)
                side = torch.cuda.Stream(self.device, priority=-1)
                with torch.cuda.stream(side):
                    for item in self.passes():
                        ready = torch.cuda.Event()
                        ready.record(side)
                        if not self._put((*item, ready)):
                            return
            except BaseException as e:  # noqa: BLE001 - re-raised on the training thread
                self._put(e)

        self.worker = threading.Thread(target=produce, name="device-batches", daemon=True)
        self.worker.start()

    def _put(self, item):
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def close(self):
        """Stop the thread (it may be preparing batches nobody will train on), or end the
        inline generator of a job stopped part-way (above: why not leave it to the collector)."""
        if self.inline is not None:
            self.inline.close()
            self.inline = None
        self.stopping.set()
        while self.worker is not None and self.worker.is_alive():
            try:
                self.queue.get(timeout=0.1)
            except queue.Empty:
                pass

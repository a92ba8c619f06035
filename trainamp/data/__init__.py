"""The input pipeline: data sets (sources.py), the workers' CPU decode (cpu.py), the GPU decode
(device.py, crop_kernel.py), the prefetch thread (prefetch.py), and the loaders (loader.py)."""

"""phasekv: chunked KV-cache compression and attention over compressed caches.

The kernels are phasekv's C++ headers compiled into ``phasekv._core`` (nanobind). Arrays go
in and out without copies (DLPack or the buffer protocol: numpy, torch on the CPU, jax);
storage dtypes are float32, bfloat16 (``ml_dtypes.bfloat16`` in numpy, ``torch.bfloat16``)
and float16; queries, outputs and log-sum-exps are float32. Errors name the argument
(``TypeError`` for a wrong dtype or a non-array, ``ValueError`` for a wrong shape, stride,
device or value; ``ShapeError`` and ``CapacityError`` are ``ValueError`` subclasses).

See docs/python.md for examples.
"""

# The compiled module may sit in another phasekv/ folder on sys.path (a CMake build tree):
# the package spans all of them.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

try:
    from ._core import (  # noqa: E402
        CapacityError,
        CompressedCache,
        FixedGates,
        GatedPool,
        Geometry,
        MaxPool,
        OffsetSelect,
        Policy,
        ShapeError,
        UniformMean,
        Visibility,
        __version__,
        compress_batch,
        decode,
        decode_arrays,
        even_origins,
        prefill,
        residue,
        residues,
        stride_lcm,
    )
    from . import eval  # noqa: E402,A004  (phasekv.eval: the phase report and sweep plans)
    from . import dsv4  # noqa: E402  (phasekv.dsv4: DeepSeek-V4 / FlashMLA operations)
    from . import serving  # noqa: E402  (phasekv.serving: paged storage, plan/run)
except ImportError as _core_error:  # noqa: F841
    # The pure-Python parts (phasekv.run) work without the compiled module; what needs it says
    # so when it is used.
    _missing = _core_error

    def __getattr__(name):
        raise ImportError(f"phasekv.{name} needs the compiled module phasekv._core, which did "
                          f"not import ({_missing}); build it with `pip install .` or the CMake "
                          "option PHASEKV_BUILD_PYTHON=ON")

__all__ = [
    "CapacityError",
    "CompressedCache",
    "FixedGates",
    "GatedPool",
    "Geometry",
    "MaxPool",
    "OffsetSelect",
    "Policy",
    "ShapeError",
    "UniformMean",
    "Visibility",
    "__version__",
    "compress_batch",
    "decode",
    "decode_arrays",
    "dsv4",
    "eval",
    "even_origins",
    "prefill",
    "residue",
    "residues",
    "serving",
    "stride_lcm",
]

"""The Axon Kernel Interface from Python: build device kernels, launch them, make them ops.

A kernel is C or C++ against ``<axon/kernel.h>`` (:func:`include_path`; documented in the
header and in docs/kernels.md)::

    import torch, torch_axon.kernel as K

    lib = K.load("scale", source=r'''
    #include <axon/kernel.h>
    using namespace axon::kernel;
    AXON_KERNEL(scale) {   // scale(x, out; floats: alpha): out = alpha * x, float32, contiguous
      View<float> x = as<float>(args->tensors[0]), out = as<float>(args->tensors[1]);
      const Vec a = Vec::broadcast(float(args->floats[0]));
      parallel_for(ctx, 0, x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
        int64_t i = b;
        for (; i + Vec::kLanes <= e; i += Vec::kLanes) (Vec::load(x.data() + i) * a).store(out.data() + i);
        if (i < e) (Vec::load_partial(x.data() + i, e - i) * a).store_partial(out.data() + i, e - i);
      });
    }
    ''')
    x = torch.randn(1000, device="axon")
    out = torch.empty_like(x)
    lib.scale(x, out, floats=(2.0,), written=(1,))   # enqueued on the current stream

**Building** (:func:`load`): ``g++ -O3 -march=native -std=c++17 -fPIC -shared
-I<include_path()>`` (``gcc -std=c11`` for ``.c`` files; ``$CXX``/``$CC`` override the
compilers); no PyTorch headers, so a small kernel builds in well under a second. The
library is cached under ``$AXON_KERNEL_CACHE`` (default
``${AXON_CACHE_DIR:-~/.cache/torch_axon}/kernels``) in a directory named by a hash of the
sources (and header files next to source files), the installed ``axon/*.h`` headers, the
flags, the compiler's version and the CPU (``-march=native`` code is per machine). It is
built in a temporary directory and renamed into place, so concurrent processes building
the same kernel are safe (one rename wins, the others use it). A warm load (cache hit)
only opens the library; :func:`build_info` tells which one happened and how long it took.
A compile error raises ``RuntimeError`` with the command and the compiler's output.

**Launching** (:class:`KernelFunction`): ``lib.entry(*tensors, ints=(), floats=(),
written=(), name=None)`` runs ``torch.ops.axon._launch_kernel``: the host checks the
tensors (all on one axon device, dtypes float32/bfloat16/float16/float64/int64/int32/
int16/int8/uint8/bool, strided, at most 8 dims) with PyTorch-style errors, bumps the
version counters of the tensors listed in ``written`` (their indices), and enqueues the
kernel on the device's current stream: ordered with every other kernel, captured by
``torch.axon.graph``, shown by the profiler as ``name`` (default ``"<library>::<entry>"``).
The first launch of a signature (the kernel, the tensors' shapes, strides and dtypes, the
signs of the numbers) runs at the call, so a kernel's ``AXON_CHECK`` of what the host can
see raises there (``RuntimeError: '<name>' failed: <message>``); later launches are
asynchronous and a failure surfaces at the next synchronising call, like a CUDA
device-side assert. The op returns nothing and allocates nothing: allocate outputs with
``torch.empty(..., device="axon")`` (the caching allocator) before the launch.

**Making it an op** (plain ``torch.library``; the op is then one opaque call for autograd,
``torch.compile`` and graphs)::

    @torch.library.custom_op("mylib::scale", mutates_args=(), device_types="axon")
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
        out = torch.empty_like(x)
        lib.scale(x.contiguous(), out, floats=(alpha,), written=(1,), name="mylib::scale")
        return out

    @scale.register_fake                      # shapes for torch.compile / meta tensors
    def _(x, alpha):
        return torch.empty_like(x)

    def _setup(ctx, inputs, output):
        ctx.alpha = inputs[1]

    def _backward(ctx, grad):                 # may call other kernels / ops
        return grad * ctx.alpha, None

    scale.register_autograd(_backward, setup_context=_setup)

**Native ops** (:meth:`KernelLibrary.op`): ``lib.op("mylib::scale(Tensor x, float alpha) ->
Tensor", shape="scale_shape")`` registers the kernel as the op's axon and Meta kernel in C++
(the ``AXON_SHAPE`` function gives the outputs): no Python per call, no ``register_fake``.

Call a :class:`KernelFunction` directly only in eager code: ``torch.compile`` sees
``axon::_launch_kernel`` as an op without outputs that mutates nothing, so wrap kernels in
a custom op (as above) for compiled code.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch

__all__ = ["load", "include_path", "build_info", "KernelLibrary", "KernelFunction", "can_skip_dispatch", "contiguous_as_fake",
           "BuildInfo", "cache_dir"]

_INCLUDE = Path(__file__).resolve().parent / "include"
_CXX_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC")
_C_FLAGS = ("-O3", "-march=native", "-std=c11", "-fPIC")
# A symbol the library uses but nothing defines fails the build (with the linker's
# message), not the first load of a cached library.
_LD_FLAGS = ("-Wl,--no-undefined",)
_HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".hxx", ".inc", ".inl")
_C_SUFFIXES = (".c",)

_lock = threading.Lock()
_loaded: dict[str, "KernelLibrary"] = {}  # hash -> library, this process
_identity_cache: dict[tuple, str] = {}
_native_ops: dict[str, tuple] = {}  # qualname -> (signature, torch.library.Library)


def include_path() -> str:
    """The directory to pass as ``-I`` (holds ``axon/kernel.h``)."""
    return str(_INCLUDE)


def cache_dir() -> Path:
    """Where built kernels live: ``$AXON_KERNEL_CACHE``, else
    ``${AXON_CACHE_DIR:-~/.cache/torch_axon}/kernels``."""
    d = os.environ.get("AXON_KERNEL_CACHE")
    if d:
        return Path(d).expanduser()
    base = os.environ.get("AXON_CACHE_DIR") or os.path.join("~", ".cache", "torch_axon")
    return Path(base).expanduser() / "kernels"


@dataclass
class BuildInfo:
    """How a :class:`KernelLibrary` was obtained (see :func:`build_info`)."""

    name: str
    path: str          # the shared library
    key: str           # the content hash (the cache directory's name)
    cached: bool       # True: found in the cache (warm); False: compiled now (cold)
    compile_seconds: float  # the compiler's wall time (0 when cached)
    total_seconds: float    # all of load(): hashing, compiling, installing, dlopen
    commands: list = field(default_factory=list)  # the compiler commands that ran
    output: str = ""   # the compiler's output (warnings), when it ran


class KernelFunction:
    """One entry point of a :class:`KernelLibrary`, callable as
    ``fn(*tensors, ints=(), floats=(), written=(), name=None)``: launches the kernel on the
    current stream of the tensors' device and returns None (see the module docstring)."""

    __slots__ = ("library", "entry", "address", "name", "_op")

    def __init__(self, library: "KernelLibrary", entry: str, address: int):
        self.library = library
        self.entry = entry
        self.address = address
        self.name = f"{library.name}::{entry}"
        self._op = torch.ops.axon._launch_kernel.default

    def __call__(self, *tensors: torch.Tensor, ints: Iterable[int] = (),
                 floats: Iterable[float] = (), written: Iterable[int] = (),
                 name: str | None = None) -> None:
        if not tensors:
            raise RuntimeError(f"axon kernel '{name or self.name}': expected at least one axon "
                               "tensor among the arguments")
        self._op(self.address, name or self.name, tensors,
                 [int(i) for i in ints] if ints else [],
                 [float(f) for f in floats] if floats else [],
                 [int(w) for w in written] if written else [])

    def __repr__(self) -> str:
        return f"KernelFunction({self.name!r}, address=0x{self.address:x})"


class KernelLibrary:
    """A built kernel library: ``lib.<entry>`` or ``lib.function("entry")`` give a
    :class:`KernelFunction`. The library stays loaded for the life of the process (queued
    launches may still call into it)."""

    def __init__(self, name: str, path: str, info: BuildInfo):
        self.name = name
        self.path = path
        self.build_info = info
        self._dll = ctypes.CDLL(path)
        self._functions: dict[str, KernelFunction] = {}

    def function(self, entry: str) -> KernelFunction:
        fn = self._functions.get(entry)
        if fn is not None:
            return fn
        try:
            sym = getattr(self._dll, entry)
        except AttributeError:
            raise AttributeError(
                f"axon kernel library '{self.name}' ({self.path}) has no entry point '{entry}' "
                "(define it with AXON_KERNEL(" + entry + ") or extern \"C\")") from None
        fn = KernelFunction(self, entry, ctypes.cast(sym, ctypes.c_void_p).value)
        self._functions[entry] = fn
        return fn

    def _symbol(self, entry: str, what: str = "AXON_KERNEL") -> int:
        try:
            return self.function(entry).address
        except AttributeError:
            raise AttributeError(
                f"axon kernel library '{self.name}' ({self.path}) has no entry point '{entry}' "
                f"(define it with {what}({entry}) or extern \"C\")") from None

    def op(self, schema: str, kernel: str | None = None, shape: str | None = None,
           name: str | None = None):
        """Registers the kernel ``kernel`` (default: the op's name) as a native PyTorch op
        and returns its ``torch.ops`` packet: ``lib.op("mylib::scale(Tensor x, float alpha)
        -> Tensor", shape="scale_shape")``. A call goes through the dispatcher to C++ only
        (no Python): the arguments are checked (one axon device, supported dtypes), the
        outputs' dtypes and sizes come from the ``AXON_SHAPE`` function ``shape`` (default:
        like the first tensor argument), they are allocated contiguous from the caching
        allocator and the kernel is launched on the current stream. The kernel gets the
        schema's ``Tensor``/``Tensor?`` arguments (None: ``AXON_NONE``) then the outputs as
        its tensors, ``int``/``SymInt``/``bool`` arguments (``int[]``: its length, then its
        elements) as its ints and ``float`` arguments as its floats, in schema order.
        ``Tensor(a!)`` arguments are written by the kernel (their versions are bumped).
        The shape function is also the op's Meta kernel, so meta tensors and
        ``torch.compile`` (one extern call, no graph break) work without a
        ``register_fake``; it sees concrete sizes, so under dynamic shapes each new size
        recompiles (without ``shape``, or with a ``torch.library.register_fake``, sizes stay
        symbolic). Add autograd to an op without ``Tensor(a!)`` arguments with
        ``torch.library.register_autograd``. Registering a qualified name again replaces its
        kernel and output rule for later calls (the schema must be the same)."""
        from torch_axon import _C
        qualname, sep, _ = schema.partition("(")
        qualname = qualname.strip()
        if not sep or "::" not in qualname:
            raise ValueError(f"expected a schema 'namespace::name(args) -> returns', got {schema!r}")
        ns, opname = qualname.split("::", 1)
        signature = schema.strip()[len(qualname):].strip()
        # compared as PyTorch prints it (spacing, defaults and aliases normalised)
        canonical = str(torch._C.parse_schema(qualname + signature))
        fn = self._symbol(kernel or opname.split(".")[0])
        shape_fn = self._symbol(shape, "AXON_SHAPE") if shape else 0
        with _lock:
            known = _native_ops.get(qualname)
            if known is None:
                library = torch.library.Library(ns, "FRAGMENT")
                library.define(opname + signature)
                try:
                    _C._register_native_op(qualname, fn, shape_fn, name or qualname)
                except BaseException:
                    library._destroy()  # an unsupported schema leaves no op behind
                    raise
                _native_ops[qualname] = (canonical, library)
            elif known[0] != canonical:
                raise RuntimeError(f"axon native op '{qualname}' is already defined with schema "
                                   f"{known[0]}; cannot redefine it as {schema!r}")
            else:
                _C._register_native_op(qualname, fn, shape_fn, name or qualname)
        packet = getattr(getattr(torch.ops, ns), opname.split(".")[0])
        return packet

    def __getattr__(self, entry: str) -> KernelFunction:
        if entry.startswith("_"):
            raise AttributeError(entry)
        return self.function(entry)

    def __repr__(self) -> str:
        return f"KernelLibrary({self.name!r}, {self.path!r})"


def can_skip_dispatch(*tensors) -> bool:
    """Whether an op's Python wrapper may launch its kernel directly instead of calling
    its ``torch.library`` custom op (whose dispatch costs ~6 us a call): nothing is being
    traced (``torch.compile``), no torch function or dispatch mode is active, and every
    argument (``None`` allowed) is a plain tensor that needs no autograd."""
    if (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return False
    return True


def contiguous_as_fake(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t`` in ``dtype`` (default: its own) with the strides ``torch.empty(t.shape)`` has,
    which is what a fake implementation that returns ``torch.empty`` promises: ``t``
    itself when it already is (strides of size-1 dims included), else a copy. For a real
    implementation whose result comes from other ops (a fallback, a transpose)."""
    dtype = t.dtype if dtype is None else dtype
    strides, n = [], 1
    for size in reversed(t.shape):
        strides.append(n)
        n *= max(size, 1)
    if t.dtype == dtype and t.stride() == tuple(reversed(strides)):
        return t
    out = torch.empty(t.shape, dtype=dtype, device=t.device)
    out.copy_(t)
    return out


def build_info(lib: KernelLibrary) -> BuildInfo:
    """How ``lib`` was built: ``cached`` (warm) or compiled now (cold), the compiler's time
    and load()'s total time, the commands."""
    return lib.build_info


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _compiler_identity(compiler: str) -> str:
    key = (compiler, os.environ.get("PATH", ""))
    ident = _identity_cache.get(key)
    if ident is None:
        try:
            r = _run([compiler, "--version"])
            ident = r.stdout.splitlines()[0] if r.stdout else f"{compiler}: rc {r.returncode}"
        except OSError as e:
            raise RuntimeError(f"axon kernel: cannot run the compiler '{compiler}': {e}") from None
        _identity_cache[key] = ident
    return ident


def _machine_identity() -> str:
    # -march=native code runs on this kind of CPU only: the model and ISA flags.
    ident = _identity_cache.get(("machine",))
    if ident is None:
        model = flags = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name") and not model:
                        model = line.split(":", 1)[1].strip()
                    elif line.startswith("flags") and not flags:
                        flags = line.split(":", 1)[1].strip()
                    if model and flags:
                        break
        except OSError:
            model = platform.processor()
        ident = f"{platform.machine()}|{model}|{flags}"
        _identity_cache[("machine",)] = ident
    return ident


def _header_files(dirs: Iterable[Path]) -> list[Path]:
    out = []
    for d in sorted(set(dirs)):
        if d.is_dir():
            out += sorted(p for p in d.iterdir() if p.suffix in _HEADER_SUFFIXES and p.is_file())
    return out


def load(name: str, sources: Sequence[str | os.PathLike] | str | os.PathLike | None = None,
         source: str | None = None, extra_cflags: Sequence[str] = (), verbose: bool = False,
         extra_ldflags: Sequence[str] = ()) -> KernelLibrary:
    """Builds (or finds in the cache) a kernel library and loads it.

    name: the library's name (a C identifier-like string; names launches "<name>::<entry>").
    sources: source files (``.c`` as C, anything else as C++); headers next to them are
        part of the cache key. source: the text of one C++ source instead.
    extra_cflags: appended to the compiler flags (e.g. ``-mno-avx512f``, ``-DTILE=64``,
        ``-Wall``); extra_ldflags: to the link. verbose: print the commands and timings.
    Returns a :class:`KernelLibrary`; raises RuntimeError with the compiler's output if the
    build fails.
    """
    t0 = time.perf_counter()
    if not isinstance(name, str) or not name or any(c in name for c in "/\\\0") or name.startswith("."):
        raise ValueError(f"axon kernel: invalid library name {name!r}")
    if (sources is None) == (source is None):
        raise ValueError("axon kernel: pass exactly one of sources= (files) and source= (a string)")
    if source is not None:
        if not isinstance(source, str):
            raise TypeError(f"axon kernel: source= must be a string, got {type(source).__name__}")
        files: list[tuple[str, str, bool]] = [(f"{name}.cpp", source, False)]  # (name, text, is_c)
        header_dirs: list[Path] = []
    else:
        if isinstance(sources, (str, os.PathLike)):
            sources = [sources]
        paths = [Path(s).resolve() for s in sources]
        if not paths:
            raise ValueError("axon kernel: sources= is empty")
        files = []
        for p in paths:
            try:
                files.append((p.name, p.read_text(), p.suffix in _C_SUFFIXES))
            except OSError as e:
                raise FileNotFoundError(f"axon kernel '{name}': cannot read source {p}: {e}") from None
        header_dirs = [p.parent for p in paths]
    cflags = [str(f) for f in extra_cflags]
    ldflags = [str(f) for f in extra_ldflags]
    cxx = os.environ.get("CXX", "g++")
    cc = os.environ.get("CC", "gcc")
    use_c = any(is_c for _, _, is_c in files)

    h = hashlib.sha256()

    def part(tag: str, data: str | bytes) -> None:
        b = data.encode() if isinstance(data, str) else data
        h.update(f"{tag}:{len(b)}:".encode())
        h.update(b)

    part("abi", "1")
    part("name", name)
    for fname, text, is_c in files:
        part("src", f"{fname}|{int(is_c)}")
        part("text", text)
    for hp in _header_files(header_dirs):
        part("hdr", hp.name)
        part("text", hp.read_bytes())
    for hp in sorted((_INCLUDE / "axon").glob("*.h")):
        part("axon", hp.name)
        part("text", hp.read_bytes())
    part("flags", "\0".join(_CXX_FLAGS + tuple(cflags) + ("|",) + tuple(ldflags)))
    part("cxx", _compiler_identity(cxx))
    if use_c:
        part("cc", _compiler_identity(cc))
        part("cflags", "\0".join(_C_FLAGS))
    part("machine", _machine_identity())
    key = h.hexdigest()[:32]

    with _lock:
        lib = _loaded.get(key)
        if lib is not None:
            return lib
        root = cache_dir()
        final = root / key
        so = final / f"lib{name}.so"
        cached = so.is_file()
        compile_s = 0.0
        commands: list = []
        output = ""
        if not cached:
            compile_s, commands, output = _build(name, files, header_dirs, root, final, cflags,
                                                 ldflags, cxx, cc, verbose)
        lib = KernelLibrary(name, str(so), BuildInfo(
            name=name, path=str(so), key=key, cached=cached, compile_seconds=compile_s,
            total_seconds=0.0, commands=commands, output=output))
        lib.build_info.total_seconds = time.perf_counter() - t0
        if verbose:
            how = "cached" if cached else f"compiled in {compile_s * 1e3:.0f} ms"
            print(f"axon kernel '{name}': {how}, loaded in "
                  f"{lib.build_info.total_seconds * 1e3:.0f} ms: {so}")
        _loaded[key] = lib
        return lib


def _build(name, files, header_dirs, root: Path, final: Path, cflags, ldflags, cxx, cc,
           verbose):
    """Compiles into a fresh temporary directory under root and renames it to `final`."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RuntimeError(f"axon kernel '{name}': cannot create the cache directory {root}: {e} "
                           "(set AXON_KERNEL_CACHE to a writable directory)") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{final.name}-", dir=root))
    try:
        srcs = []
        for i, (fname, text, is_c) in enumerate(files):
            # Numbered: two sources may share a file name (a/k.cpp, b/k.cpp).
            p = tmp / (fname if len(files) == 1 else f"{i}-{fname}")
            p.write_text(text)
            srcs.append((p, is_c))
        includes = [f"-I{_INCLUDE}"] + [f"-I{d}" for d in dict.fromkeys(header_dirs)]
        so = tmp / f"lib{name}.so"
        commands = []
        if len(srcs) == 1:
            src, is_c = srcs[0]
            base = [cc, *_C_FLAGS] if is_c else [cxx, *_CXX_FLAGS]
            commands.append([*base, "-shared", *includes, *cflags, str(src), "-o", str(so),
                             *_LD_FLAGS, *ldflags, "-lm"])
        else:
            objs = []
            for i, (src, is_c) in enumerate(srcs):
                obj = tmp / f"{i}-{src.stem}.o"
                base = [cc, *_C_FLAGS] if is_c else [cxx, *_CXX_FLAGS]
                commands.append([*base, "-c", *includes, *cflags, str(src), "-o", str(obj)])
                objs.append(str(obj))
            commands.append([cxx, "-shared", "-fPIC", *objs, "-o", str(so), *_LD_FLAGS,
                             *ldflags, "-lm"])
        t0 = time.perf_counter()
        output = ""
        for cmd in commands:
            if verbose:
                print("$ " + " ".join(cmd))
            r = _run(cmd)
            output += r.stdout
            if verbose and r.stdout:
                print(r.stdout, end="")
            if r.returncode != 0:
                raise RuntimeError(
                    f"Error building axon kernel '{name}' (exit code {r.returncode}):\n"
                    f"$ {' '.join(cmd)}\n{r.stdout.rstrip()}")
        compile_s = time.perf_counter() - t0
        try:
            os.rename(tmp, final)  # atomic; fails if another process installed it first
        except OSError:
            if not (final / so.name).is_file():
                # A directory without its library (removed by hand): replace it.
                shutil.rmtree(final, ignore_errors=True)
                try:
                    os.rename(tmp, final)
                except OSError:
                    if not (final / so.name).is_file():  # not another process's install
                        raise RuntimeError(f"axon kernel '{name}': cannot install the built "
                                           f"library into {final}") from None
        return compile_s, commands, output
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _main(argv=None) -> int:
    """python -m torch_axon.kernel [--name NAME] [--cflags FLAGS] SOURCE...: cold and warm
    build times of a kernel library (cold: a fresh cache directory; warm: a new process
    loading from that cache)."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m torch_axon.kernel", description=_main.__doc__)
    p.add_argument("sources", nargs="+")
    p.add_argument("--name", default=None, help="library name (default: the first source's stem)")
    p.add_argument("--cflags", default="", help="extra compiler flags, one string")
    p.add_argument("--warm-runs", type=int, default=3)
    args = p.parse_args(argv)
    name = args.name or Path(args.sources[0]).stem
    cflags = args.cflags.split()
    with tempfile.TemporaryDirectory(prefix="axon-kernel-timing-") as d:
        env = dict(os.environ, AXON_KERNEL_CACHE=d)
        code = ("import json, sys, torch_axon.kernel as K; "
                "lib = K.load(sys.argv[1], sources=sys.argv[3:], extra_cflags=sys.argv[2].split()); "
                "i = K.build_info(lib); "
                "print(json.dumps([i.cached, i.compile_seconds, i.total_seconds]))")
        runs = []
        for _ in range(1 + max(args.warm_runs, 1)):
            r = subprocess.run([sys.executable, "-c", code, name, " ".join(cflags), *args.sources],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr, end="")
                return r.returncode
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    cold, warm = runs[0], runs[1:]
    assert not cold[0] and all(w[0] for w in warm)
    print(f"{name}: cold build {cold[2] * 1e3:.0f} ms (compiler {cold[1] * 1e3:.0f} ms); "
          f"warm load {min(w[2] for w in warm) * 1e3:.1f} ms (best of {len(warm)} new processes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

"""ctypes bindings to kvprune, an arena-backed, pruning KV cache behind a C ABI.

Standard library only. Tensors may be ``array.array('f')``, any buffer of float32
(``memoryview``, ``bytearray``), numpy float32 arrays (other numpy dtypes are converted when
numpy is installed) or plain sequences of floats::

    import kvprune
    m = kvprune.Model(n_layers=2, n_q_heads=4, n_kv_heads=2, head_dim=64, rope=kvprune.ROPE_NEOX)
    with kvprune.Cache(m, "policy=streaming sinks=4 window=252") as c:
        out = c.decode(0, q, k, v)          # q: 4*64 floats, k and v: 2*64 floats
        print(c.stats())

The library is static (libkvprune.a); Python loads a shared object made from it.
``pip install ./ports/python`` (offline: the build backend is in the package) links one into the
package from the installed library (``pkg-config kvprune``), else from the library it builds from the
checkout with cmake, else it fails and says what to do. Where it is looked for, first match wins:
  1. ``KVPRUNE_LIB``: path of a shared library with the kvp_* symbols;
  2. ``libkvprune.so`` in ``KVPRUNE_LIB_DIR`` or beside this package;
  3. ``ctypes.util.find_library("kvprune")``.
``build_shared_library(dest)`` makes that shared object from the installed static library
(``pkg-config --static --libs kvprune`` and the C++ compiler ``$CXX`` or ``c++``).

Errors are ``KvpError`` with ``status`` (the pinned int), ``name`` and ``message``; every message
has the library's one format, "<status>: <detail>". Integer arguments must fit the C types:
layer and KV head in 0..2**32-1 (else ERR_LAYER), positions in int32 (else ERR_ARG) - never
silently truncated.
"""
from __future__ import annotations

import array
import ctypes
import ctypes.util
import mmap
import operator
import os
import shlex
import subprocess
import sys
import threading
from collections import namedtuple

__all__ = [
    "KvpError", "Model", "Config", "Cache", "Stats", "LayerStats", "Selection", "KeyInfo", "version",
    "status_str", "config_keys", "build_shared_library", "load_library",
    "rope_freqs_linear", "rope_freqs_llama3", "rope_freqs_yarn", "rope_freqs_divided",
]

# ---- pinned C enums -------------------------------------------------------------------
(OK, ERR_ARG, ERR_CONFIG, ERR_ARENA, ERR_LAYER, ERR_FULL, ERR_NONFINITE, ERR_STATE, ERR_UNSUPPORTED,
 ERR_BUFFER) = range(10)
STATUS_NAMES = {0: "OK", 1: "ERR_ARG", 2: "ERR_CONFIG", 3: "ERR_ARENA", 4: "ERR_LAYER", 5: "ERR_FULL",
                6: "ERR_NONFINITE", 7: "ERR_STATE", 8: "ERR_UNSUPPORTED", 9: "ERR_BUFFER"}
ROPE_NONE, ROPE_NEOX, ROPE_GPTJ = 0, 1, 2
(POLICY_FULL, POLICY_WINDOW, POLICY_STREAMING, POLICY_H2O, POLICY_SNAPKV, POLICY_PYRAMIDKV,
 POLICY_LETHE, POLICY_SIMLAYERKV, POLICY_ASL, POLICY_THINK, POLICY_RANDOM, POLICY_TRIATTENTION) = range(12)
POS_DEFAULT, POS_ORIGINAL, POS_REALIGN = 0, 1, 2
DTYPE_F32, DTYPE_F16, DTYPE_Q8, DTYPE_Q4 = 0, 1, 2, 3
SCORE_FLOAT, SCORE_FIXED = 0, 1
POOL_AVG, POOL_MAX = 0, 1
IO_F32, IO_F16, IO_BF16 = 0, 1, 2  # kvp_io_dtype: element type of the *_half calls' rows
THREAD_POOL_OWN, THREAD_POOL_HOST = 0, 1  # kvp_thread_pool (key thread_pool; Cache.set_parallel)

_u32, _f32, _enum = ctypes.c_uint32, ctypes.c_float, ctypes.c_uint32  # C enums are int-sized


class _Model(ctypes.Structure):
    _fields_ = [("n_layers", _u32), ("n_q_heads", _u32), ("n_kv_heads", _u32), ("head_dim", _u32),
                ("rope", _enum), ("rope_dim", _u32), ("rope_theta", _f32)]


class _Config(ctypes.Structure):
    # Field order of kvp_config in include/kvprune/kvprune.h, exactly.
    _fields_ = [
        ("struct_size", _u32), ("model", _Model), ("policy", _enum), ("capacity", _u32),
        ("positions", _enum), ("threads", _u32), ("kv_dtype", _enum), ("score", _enum),
        ("sinks", _u32), ("window", _u32), ("extra", _u32), ("compress_every", _u32),
        ("slack", _u32), ("max_drop", _u32),
        ("budget", _u32), ("recent", _u32), ("obs_window", _u32), ("pool_kernel", _u32),
        ("pool", _enum), ("beta", _f32),
        ("sparse_ratio", _f32), ("recent_ratio", _f32), ("segments", _u32), ("decay", _f32),
        ("lazy_threshold", _f32), ("lazy_last", _u32), ("lazy_mode", _u32), ("nonlazy", _enum),
        ("asl_min_layer", _u32), ("asl_obs_layers", _u32), ("asl_tau", _f32),
        ("key_channel_ratio", _f32), ("value_channel_ratio", _f32), ("channel_score", _u32),
        ("block", _u32), ("total_capacity", _u32),
        ("evict_threshold", _u32), ("prefill_stage", _u32),
        ("token_policy", _enum), ("quant_group", _u32),
        ("lazy_force", _u32),
        ("max_draft", _u32), ("attn_scale", _f32), ("logit_softcap", _f32),  # issue 21
        ("rope_attn_factor", _f32),  # issue 21: RoPE frequencies from the caller
        ("sliding_window", _u32), ("sliding_pattern", _u32),  # issue 21 item 5
        ("kv_rotate", _enum),  # issue 23
        ("max_prompt", _u32),  # issue 28
        ("max_new", _u32),  # issue 28: the papers' defaults
        ("prompt_scores", _u32),
        ("seed", _u32), ("keep_prompt", _u32),  # issue 32: the random baseline
        ("tri_mode", _enum), ("tri_stats", _enum),  # issue 32: TriAttention
        ("duo_sink", _u32), ("duo_window", _u32),  # issue 32: DuoAttention's streaming heads
        ("head_budget", _enum), ("ada_floor", _f32),  # issue 32: AdaKV's per-head budgets
        ("thread_pool", _enum),  # issue 30: running on the host's threads (Cache.set_parallel)
    ]


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("arena_bytes", ctypes.c_uint64), ("live_bytes", ctypes.c_uint64),
                ("peak_live_bytes", ctypes.c_uint64), ("tokens_seen", ctypes.c_uint64),
                ("prune_events", ctypes.c_uint64), ("tokens_evicted", ctypes.c_uint64)]


class _LayerStats(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("capacity", _u32), ("len", _u32), ("live_bytes", ctypes.c_uint64),
                ("prune_events", ctypes.c_uint64), ("tokens_evicted", ctypes.c_uint64),
                ("evict_threshold", _u32), ("sparsity", _f32), ("lazy", ctypes.c_int32),
                ("prompt_early", _u32)]


class _KeyInfo(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("name", ctypes.c_char_p), ("type", _enum), ("min", ctypes.c_double),
                ("max", ctypes.c_double), ("default_value", ctypes.c_double), ("values", ctypes.c_char_p),
                ("default_name", ctypes.c_char_p), ("policies", _u32), ("config_size", _u32),
                ("help", ctypes.c_char_p)]


class _Selection(ctypes.Structure):
    _fields_ = [("struct_size", _u32), ("capacity", _u32), ("indices", ctypes.POINTER(ctypes.c_int32)),
                ("n", _u32), ("selected", ctypes.c_int32)]


_FP = ctypes.POINTER(ctypes.c_float)
_DP = ctypes.POINTER(ctypes.c_double)
_IP = ctypes.POINTER(ctypes.c_int32)
_CP = ctypes.c_void_p  # kvp_cache *
# kvp_parallel_fn and its task (issue 30): void fn(void *user, uint32_t n, void (*task)(void *arg,
# uint32_t t), void *arg). CFUNCTYPE: calling the task releases the GIL.
_TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _u32)
_PARALLEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _u32, _TASK, ctypes.c_void_p)

_lib = None
_lib_lock = threading.Lock()


def _declare(lib):
    sigs = {
        "kvp_version": (_u32, []),
        "kvp_status_str": (ctypes.c_char_p, [_u32]),
        "kvp_config_default": (_u32, [ctypes.POINTER(_Config), ctypes.POINTER(_Model)]),
        "kvp_config_init": (_u32, [ctypes.POINTER(_Config), _u32, ctypes.POINTER(_Model)]),
        "kvp_config_default_ex": (_u32, [ctypes.POINTER(_Config), ctypes.POINTER(_Model), ctypes.c_char_p,
                                         ctypes.c_size_t]),
        "kvp_config_init_ex": (_u32, [ctypes.POINTER(_Config), _u32, ctypes.POINTER(_Model), ctypes.c_char_p,
                                      ctypes.c_size_t]),
        "kvp_config_apply": (_u32, [ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_config_check": (_u32, [ctypes.POINTER(_Config), ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_arena_size": (ctypes.c_size_t, [ctypes.POINTER(_Config)]),
        "kvp_arena_advise": (_u32, [ctypes.c_void_p, ctypes.c_size_t]),
        "kvp_create": (_u32, [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_CP)]),
        "kvp_create_ex": (_u32, [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_CP),
                                 ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_destroy": (None, [_CP]),
        "kvp_reset": (_u32, [_CP]),
        "kvp_prefill": (_u32, [_CP, _u32, _u32, _IP, _FP, _FP, _FP, _FP, ctypes.POINTER(_Selection)]),
        "kvp_decode": (_u32, [_CP, _u32, _FP, _FP, _FP, _FP]),
        "kvp_append": (_u32, [_CP, _u32, _u32, _IP, _FP, _FP]),
        "kvp_prefill_ex": (_u32, [_CP, _u32, _u32, _IP, _enum, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.POINTER(_Selection)]),
        "kvp_decode_ex": (_u32, [_CP, _u32, _enum, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p]),
        "kvp_append_ex": (_u32, [_CP, _u32, _u32, _IP, _enum, ctypes.c_void_p, ctypes.c_void_p]),
        "kvp_layer_len": (_u32, [_CP, _u32]),
        "kvp_layer_positions": (_u32, [_CP, _u32, _u32, _IP, _u32, ctypes.POINTER(_u32)]),
        "kvp_layer_capacity": (_u32, [_CP, _u32]),
        "kvp_prefill_room": (_u32, [_CP]),
        "kvp_get_stats": (_u32, [_CP, ctypes.POINTER(_Stats)]),
        "kvp_get_layer_stats": (_u32, [_CP, _u32, ctypes.POINTER(_LayerStats)]),
        "kvp_last_error": (ctypes.c_char_p, [_CP]),
        "kvp_draft_begin": (_u32, [_CP]),
        "kvp_prompt_end": (_u32, [_CP]),
        "kvp_query_stats_set": (_u32, [_CP, _u32, _u32, _FP, _FP, _u32]),
        "kvp_draft_commit": (_u32, [_CP, _u32]),
        "kvp_set_parallel": (_u32, [_CP, _PARALLEL_FN, ctypes.c_void_p]),  # issue 30
        "kvp_state_size": (ctypes.c_size_t, [_CP]),
        "kvp_state_save": (_u32, [_CP, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "kvp_state_load": (_u32, [_CP, ctypes.c_void_p, ctypes.c_size_t]),
        "kvp_config_key_count": (_u32, []),
        "kvp_config_key": (_u32, [_u32, ctypes.POINTER(_KeyInfo)]),
        "kvp_config_key_used": (ctypes.c_int, [ctypes.POINTER(_Config), ctypes.c_char_p]),
        # issue 21: RoPE frequencies from the caller
        "kvp_rope_check": (_u32, [ctypes.POINTER(_Config), _DP, _u32, ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_create_rope": (_u32, [ctypes.POINTER(_Config), _DP, _u32, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.POINTER(_CP), ctypes.c_char_p, ctypes.c_size_t]),
        # issue 32 item 2: DuoAttention role tables
        "kvp_arena_size_heads": (ctypes.c_size_t, [ctypes.POINTER(_Config), ctypes.POINTER(ctypes.c_uint8), _u32]),
        "kvp_create_heads": (_u32, [ctypes.POINTER(_Config), _DP, _u32, ctypes.POINTER(ctypes.c_uint8), _u32,
                                    ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_CP), ctypes.c_char_p,
                                    ctypes.c_size_t]),
        "kvp_rope_freqs_linear": (_u32, [_DP, _u32, ctypes.c_double, ctypes.c_double, ctypes.c_char_p,
                                         ctypes.c_size_t]),
        "kvp_rope_freqs_llama3": (_u32, [_DP, _u32, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                         ctypes.c_double, ctypes.c_double, ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_rope_freqs_yarn": (_u32, [_DP, _u32, ctypes.c_double, ctypes.c_double, ctypes.c_double,
                                       ctypes.c_double, ctypes.c_double, _FP, ctypes.c_char_p, ctypes.c_size_t]),
        "kvp_rope_freqs_divided": (_u32, [_DP, _u32, ctypes.c_double, _FP, ctypes.c_char_p, ctypes.c_size_t]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


def _candidates():
    env = os.environ.get("KVPRUNE_LIB")
    if env:
        yield env
        return
    names = ["libkvprune.so", "libkvprune.dylib", "kvprune.dll"]
    for d in (os.environ.get("KVPRUNE_LIB_DIR"), os.path.dirname(os.path.abspath(__file__))):
        if d:
            for n in names:
                p = os.path.join(d, n)
                if os.path.exists(p):
                    yield p
    found = ctypes.util.find_library("kvprune")
    if found:
        yield found


def load_library(path=None):
    """Loads (once) and returns the ctypes library; ``path`` overrides the search."""
    global _lib
    with _lib_lock:
        if _lib is not None and path is None:
            return _lib
        tried = []
        for p in ([path] if path else _candidates()):
            try:
                lib = _declare(ctypes.CDLL(p))
            except OSError as e:
                tried.append("%s: %s" % (p, e))
                continue
            _lib = lib
            return lib
        raise OSError("kvprune shared library not found: `pip install ./ports/python` bundles one (it needs the "
                      "installed library or cmake), or set KVPRUNE_LIB=<path of libkvprune.so> (make one with "
                      "kvprune.build_shared_library(path)); tried: %s" % ("; ".join(tried) or "nothing"))


def build_shared_library(dest, static_lib=None, libs=None, cxx=None):
    """Links the static libkvprune.a into the shared object ``dest`` and returns its path.

    ``static_lib`` defaults to the one pkg-config names (``--static --libs kvprune``: its -L
    folder); ``libs`` to the other flags pkg-config gives (C++ runtime, libm, pthreads). The
    archive must be position-independent (the CMake build is: CMAKE_POSITION_INDEPENDENT_CODE).
    """
    cxx = cxx or os.environ.get("CXX") or "c++"
    if static_lib is None or libs is None:
        pc = os.environ.get("PKG_CONFIG", "pkg-config")
        r = subprocess.run([pc, "--static", "--libs", "kvprune"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode != 0:
            raise OSError("`%s --static --libs kvprune` failed: %s" % (pc, r.stderr.strip() or "exit %d" % r.returncode))
        flags = shlex.split(r.stdout)
        dirs = [f[2:] for f in flags if f.startswith("-L")]
        if static_lib is None:
            for d in dirs:
                if os.path.exists(os.path.join(d, "libkvprune.a")):
                    static_lib = os.path.join(d, "libkvprune.a")
                    break
            else:
                raise OSError("libkvprune.a not found in %s" % dirs)
        if libs is None:
            libs = [f for f in flags if f != "-lkvprune" and not f.startswith("-L")]
    cmd = [cxx, "-shared", "-o", dest, "-Wl,--whole-archive", static_lib, "-Wl,--no-whole-archive"] + list(libs)
    subprocess.check_call(cmd)
    return dest


def version():
    """(major, minor, patch) of the loaded library."""
    v = load_library().kvp_version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


def status_str(status):
    return load_library().kvp_status_str(status).decode("utf-8", "replace")


class KvpError(Exception):
    """A failed call: ``status`` (int, the pinned kvp_status) and ``message`` ("<status>: <detail>",
    the library's one format; str(error) is the message, the status text is not repeated)."""

    def __init__(self, status, message=""):
        self.status = status
        self.message = message
        super().__init__(message if message else status_str(status))

    @property
    def name(self):
        return STATUS_NAMES.get(self.status, "UNKNOWN")


def _error(status, detail):
    """An error of this binding in the library's format."""
    return KvpError(status, "%s: %s" % (status_str(status), detail))


def _arg_error(msg):
    return _error(ERR_ARG, msg)


_U32_MAX = 2 ** 32 - 1


def _index(value, what):
    """A layer or KV head index as uint32_t: values that would wrap are ERR_LAYER, not truncated."""
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise _arg_error("%s must be an integer, got %r" % (what, value))
    if v != value or not 0 <= v <= _U32_MAX:
        raise _error(ERR_LAYER, "%s %r is out of range (0..%d)" % (what, value, _U32_MAX))
    return v


_ERR_LEN = 512


def _check_buf(status, buf):
    if status != OK:
        raise KvpError(status, buf.value.decode("utf-8", "replace"))


def _uint32(value, what):
    """A model field as uint32_t: an int (not bool) in 0..2**32-1, else ERR_CONFIG (ctypes would
    keep only the low 32 bits: 2**32 + 2 layers would become 2)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)  # int, numpy integers; not float or bool
    except TypeError:
        raise _error(ERR_CONFIG, "model.%s=%r is not an integer" % (what, value))
    if not 0 <= v <= _U32_MAX:
        raise _error(ERR_CONFIG, "model.%s=%d is out of range (0..%d)" % (what, v, _U32_MAX))
    return v


class Model:
    """Model geometry (kvp_model). rope_dim 0 means head_dim. Integer fields must fit uint32_t
    (else KvpError ERR_CONFIG, here and whenever the model is used after a field was changed)."""

    def __init__(self, n_layers, n_q_heads, n_kv_heads, head_dim, rope=ROPE_NONE, rope_dim=0, rope_theta=10000.0):
        self.n_layers, self.n_q_heads, self.n_kv_heads, self.head_dim = n_layers, n_q_heads, n_kv_heads, head_dim
        self.rope, self.rope_dim, self.rope_theta = rope, rope_dim, rope_theta
        self._raw()

    def _raw(self):
        ints = [_uint32(getattr(self, f), f) for f in ("n_layers", "n_q_heads", "n_kv_heads", "head_dim", "rope",
                                                        "rope_dim")]
        try:
            theta = float(self.rope_theta)
        except (TypeError, ValueError):
            raise _error(ERR_CONFIG, "model.rope_theta=%r is not a number" % (self.rope_theta,))
        return _Model(*ints, theta)

    def __repr__(self):
        return "Model(%r, %r, %r, %r, rope=%r, rope_dim=%r, rope_theta=%r)" % (
            self.n_layers, self.n_q_heads, self.n_kv_heads, self.head_dim, self.rope, self.rope_dim, self.rope_theta)


KEY_UINT, KEY_FLOAT, KEY_ENUM = 0, 1, 2
KeyInfo = namedtuple("KeyInfo", "name key_type min max default_value values default_name policies config_size help")
KeyInfo.__doc__ = """One row of the library's key table (kvp_config_key): ``key_type`` (C: type) is KEY_UINT, KEY_FLOAT or
KEY_ENUM; ``values`` ("avg|max") and ``default_name`` are None for numeric keys; ``policies`` has bit
``1 << POLICY_x`` set for each policy that uses the key."""


def _s(b):
    return None if b is None else b.decode("utf-8", "replace")


def config_keys():
    """The library's configuration keys (kvp_config_key_count / kvp_config_key), in field order."""
    lib = load_library()
    keys = []
    for i in range(lib.kvp_config_key_count()):
        k = _KeyInfo()
        k.struct_size = ctypes.sizeof(_KeyInfo)
        st = lib.kvp_config_key(i, ctypes.byref(k))
        if st != OK:
            raise _error(st, "kvp_config_key(%d) failed" % i)
        keys.append(KeyInfo(_s(k.name), k.type, k.min, k.max, k.default_value, _s(k.values), _s(k.default_name),
                            k.policies, k.config_size, _s(k.help)))
    return keys


_keys_by_name = None


def _key(name):
    """The key table row of ``name`` that this binding's kvp_config holds; ERR_CONFIG otherwise."""
    global _keys_by_name
    if _keys_by_name is None:
        _keys_by_name = {k.name: k for k in config_keys()}
    k = _keys_by_name.get(name) if isinstance(name, str) else None
    if k is not None and k.config_size == 0:
        raise _error(ERR_CONFIG, "%s is an apply-only key (kvp_config_apply resolves it into other fields; "
                                 "nothing is stored): use apply(\"%s=...\")" % (name, name))
    if k is None or k.config_size > ctypes.sizeof(_Config):
        raise _error(ERR_CONFIG, "unknown key %r" % (name,))
    return k


class Config:
    """kvp_config: defaults for a model plus spec strings. ``get(key)``/``set(key, value)`` read and
    write one field by its spec key; fields also read as attributes (cfg.window)."""

    def __init__(self, model, spec=""):
        lib = load_library()
        self._raw = _Config()
        m = model._raw()
        buf = ctypes.create_string_buffer(_ERR_LEN)  # kvp_config_init_ex names the wrong model field
        _check_buf(lib.kvp_config_init_ex(ctypes.byref(self._raw), ctypes.sizeof(_Config), ctypes.byref(m), buf,
                                          _ERR_LEN), buf)
        self.model = model
        if spec:
            self.apply(spec)

    def apply(self, spec):
        """Applies a spec ("policy=streaming sinks=4 window=1020"), all-or-nothing."""
        if "\0" in spec:
            raise _arg_error("spec contains a NUL character")
        buf = ctypes.create_string_buffer(_ERR_LEN)
        st = load_library().kvp_config_apply(ctypes.byref(self._raw), spec.encode(), buf, _ERR_LEN)
        _check_buf(st, buf)
        return self

    def check(self):
        """kvp_config_check: raises KvpError when the configuration is not consistent."""
        buf = ctypes.create_string_buffer(_ERR_LEN)
        _check_buf(load_library().kvp_config_check(ctypes.byref(self._raw), buf, _ERR_LEN), buf)

    def rope_check(self, inv_freq):
        """kvp_rope_check: raises KvpError unless inv_freq (rope_dim/2 inverse frequencies, each
        finite and > 0; empty or None = no table) fits this configuration. Creates nothing."""
        tab = [float(x) for x in (inv_freq or [])]
        n = _uint32(len(tab), "len(inv_freq)")
        arr = (ctypes.c_double * n)(*tab) if n else None
        buf = ctypes.create_string_buffer(_ERR_LEN)
        _check_buf(load_library().kvp_rope_check(ctypes.byref(self._raw), arr, n, buf, _ERR_LEN), buf)

    def arena_size(self):
        """Exact arena bytes a cache of this configuration needs (kvp_arena_size); 0 if invalid."""
        return load_library().kvp_arena_size(ctypes.byref(self._raw))

    def arena_size_heads(self, roles):
        """kvp_arena_size_heads: exact arena bytes with a DuoAttention role table (one HEAD_RETRIEVAL /
        HEAD_STREAMING per layer and KV head, layer-major; None or empty = no table); 0 if invalid."""
        tab, n = _role_table(roles)
        return load_library().kvp_arena_size_heads(ctypes.byref(self._raw), tab, n)

    def key_used(self, name):
        """kvp_config_key_used: whether key ``name`` affects a cache of this configuration; an
        unknown key is KvpError ERR_CONFIG."""
        if not isinstance(name, str) or "\0" in name:
            raise _error(ERR_CONFIG, "unknown key %r" % (name,))
        r = load_library().kvp_config_key_used(ctypes.byref(self._raw), name.encode())
        if r < 0:
            raise _error(ERR_CONFIG, "unknown key %r" % (name,))
        return bool(r)

    def __getattr__(self, name):
        raw = self.__dict__.get("_raw")
        if raw is not None and name in dict(_Config._fields_):
            return getattr(raw, name)
        raise AttributeError(name)

    def get(self, name):
        """The field of spec key ``name``: an int (uint and enum keys) or a float."""
        k = _key(name)
        return getattr(self._raw, k.name)

    def set(self, name, value):
        """Sets the field of spec key ``name`` directly (no cross-field check: that happens when a
        Cache is created, or with check()). The value must be in the key's range from the key table
        (uint: an integer in min..max; float: a number in min..max; enum: an integer 0..max, e.g.
        POLICY_H2O), else KvpError ERR_CONFIG and the field is unchanged: never truncated."""
        k = _key(name)
        if k.key_type == KEY_FLOAT:
            if isinstance(value, bool):
                raise _error(ERR_CONFIG, "%s=%r is not a number" % (name, value))
            try:
                v = float(value)
            except (TypeError, ValueError, OverflowError):
                raise _error(ERR_CONFIG, "%s=%r is not a number" % (name, value))
            if not k.min <= v <= k.max:  # NaN fails too
                raise _error(ERR_CONFIG, "%s=%r is out of range (%g..%g)" % (name, value, k.min, k.max))
        else:
            try:
                if isinstance(value, bool):
                    raise TypeError
                v = operator.index(value)
            except TypeError:
                raise _error(ERR_CONFIG, "%s=%r is not an integer" % (name, value))
            lo = 0 if k.key_type == KEY_ENUM else k.min
            if not lo <= v <= k.max:
                raise _error(ERR_CONFIG, "%s=%d is out of range (%d..%d)" % (name, v, lo, k.max))
        setattr(self._raw, k.name, v)


Stats = namedtuple("Stats", "arena_bytes live_bytes peak_live_bytes tokens_seen prune_events tokens_evicted")
LayerStats = namedtuple("LayerStats",
                        "capacity len live_bytes prune_events tokens_evicted evict_threshold sparsity lazy prompt_early")
LayerStats.__doc__ = """kvp_layer_stats of one layer; ``lazy`` is 1 (SimLayerKV: lazy, trimmed to sinks + window),
0 (not lazy) or -1 (undecided, or another policy)."""
Selection = namedtuple("Selection", "selected indices")

try:  # optional
    import numpy as _np  # type: ignore
except Exception:  # pragma: no cover - numpy is optional
    _np = None


def _is_numpy(x):
    return _np is not None and isinstance(x, _np.ndarray)


def _as_floats(x, name, writable=False):
    """Returns (ctypes float array sharing or copying x's data, keepalive, n_floats)."""
    if x is None:
        return None, None, 0
    if _is_numpy(x):
        if x.dtype != _np.float32 or not x.flags.c_contiguous:
            if writable:
                raise _arg_error("%s must be a C-contiguous float32 numpy array" % name)
            x = _np.ascontiguousarray(x, dtype=_np.float32)
    elif isinstance(x, (list, tuple)):
        if writable:
            raise _arg_error("%s must be a writable float32 buffer" % name)
        x = array.array("f", x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise _arg_error("%s: expected a float32 buffer, array('f'), numpy array or sequence, got %s"
                         % (name, type(x).__name__))
    if mv.format not in ("f", "<f", "=f", "@f", "B", "b", "c") or not mv.c_contiguous:
        if _np is not None and not writable:
            return _as_floats(_np.asarray(mv).astype(_np.float32), name)
        raise _arg_error("%s: buffer of format %r (need contiguous float32)" % (name, mv.format))
    mv = mv.cast("B")
    if mv.nbytes % 4:
        raise _arg_error("%s: %d bytes is not a whole number of float32" % (name, mv.nbytes))
    n = mv.nbytes // 4
    if mv.readonly:
        if writable:
            raise _arg_error("%s is read-only" % name)
        arr = (ctypes.c_float * n).from_buffer_copy(mv)
        return arr, arr, n
    arr = (ctypes.c_float * n).from_buffer(mv)
    return arr, (arr, mv, x), n


_HALF_DTYPES = {"f16": IO_F16, "bf16": IO_BF16, IO_F16: IO_F16, IO_BF16: IO_BF16}


def _half_dtype(dtype):
    try:
        return _HALF_DTYPES[dtype]
    except (KeyError, TypeError):
        raise _arg_error("dtype=%r: expected 'f16' or 'bf16' (IO_F16, IO_BF16)" % (dtype,))


def _as_halves(x, name, dt, writable=False):
    """(ctypes uint16 array sharing or copying x's 2-byte elements, keepalive, n). Accepts numpy
    float16 arrays (f16), numpy uint16 arrays (the bits, f16 or bf16), array('H'), and buffers of
    format 'e' or 'H'; nothing is converted from another type (a half call takes half rows)."""
    if x is None:
        return None, None, 0
    if _is_numpy(x):
        ok = x.dtype == _np.uint16 or (x.dtype == _np.float16 and dt == IO_F16)
        if not ok or not x.flags.c_contiguous:
            raise _arg_error("%s must be a C-contiguous %s numpy array" %
                             (name, "float16 or uint16" if dt == IO_F16 else "uint16 (bfloat16 bits)"))
    try:
        mv = memoryview(x)
    except TypeError:
        raise _arg_error("%s: expected a buffer of 2-byte elements (array('H'), numpy float16/uint16), got %s"
                         % (name, type(x).__name__))
    if mv.format not in ("e", "<e", "=e", "@e", "H", "<H", "=H", "@H") or not mv.c_contiguous:
        raise _arg_error("%s: buffer of format %r (need contiguous 2-byte halves: 'e' or 'H')" % (name, mv.format))
    if mv.format.endswith("e") and dt != IO_F16:
        raise _arg_error("%s: a float16 buffer for dtype bf16 (pass the bfloat16 bits as uint16)" % name)
    mv = mv.cast("B")
    n = mv.nbytes // 2
    if mv.readonly:
        if writable:
            raise _arg_error("%s is read-only" % name)
        arr = (ctypes.c_uint16 * n).from_buffer_copy(mv)
        return arr, arr, n
    arr = (ctypes.c_uint16 * n).from_buffer(mv)
    return arr, (arr, mv, x), n


def _vp(arr):
    return ctypes.cast(arr, ctypes.c_void_p) if arr is not None else None


def _fp(arr):
    return ctypes.cast(arr, _FP) if arr is not None else None


def _positions(p, n):
    if p is None:
        return None
    if len(p) != n:
        raise _arg_error("positions has %d entries, expected %d" % (len(p), n))
    vals = [int(i) for i in p]
    for i, v in enumerate(vals):
        if not -2 ** 31 <= v < 2 ** 31:  # ctypes would wrap 2**32+5 to 5
            raise _arg_error("positions[%d]=%d does not fit in int32" % (i, v))
    return (ctypes.c_int32 * len(vals))(*vals)


def _rope_table(freqs):
    if freqs is None:
        return None, 0
    vals = [float(x) for x in freqs]
    return (ctypes.c_double * len(vals))(*vals), len(vals)


def _rope_call(fn, n, *args):
    n = _uint32(n, "n")
    if n == 0:
        raise _arg_error("n (rope_dim/2 pairs) must be > 0")
    out = (ctypes.c_double * n)()
    err = ctypes.create_string_buffer(_ERR_LEN)
    _check_buf(fn(out, n, *args, err, _ERR_LEN), err)
    return list(out)


def rope_freqs_linear(n, theta, factor):
    """Linear RoPE scaling (position interpolation): n = rope_dim/2 inverse frequencies theta^(-i/n)/factor."""
    return _rope_call(load_library().kvp_rope_freqs_linear, n, float(theta), float(factor))


def rope_freqs_llama3(n, theta, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Llama 3.1's RoPE frequencies (kvp_rope_freqs_llama3): a list of n = rope_dim/2 floats."""
    return _rope_call(load_library().kvp_rope_freqs_llama3, n, float(theta), float(factor), float(low_freq_factor),
                      float(high_freq_factor), float(original_max_position_embeddings))


def rope_freqs_yarn(n, theta, factor, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0):
    """YaRN (kvp_rope_freqs_yarn): (frequencies, attention factor); pass the factor as the config key
    rope_attn_factor."""
    a = ctypes.c_float(0.0)
    f = _rope_call(load_library().kvp_rope_freqs_yarn, n, float(theta), float(factor),
                   float(original_max_position_embeddings), float(beta_fast), float(beta_slow), ctypes.pointer(a))
    return f, a.value


def rope_freqs_divided(n, theta, divisors):
    """theta^(-i/n) / divisors[i] (a GGUF rope_freqs tensor, LongRoPE factors)."""
    d = [float(x) for x in divisors]
    if len(d) != _uint32(n, "n"):
        raise _arg_error("divisors has %d entries, expected n=%d" % (len(d), n))
    return _rope_call(load_library().kvp_rope_freqs_divided, n, float(theta), (ctypes.c_float * len(d))(*d))


HEAD_RETRIEVAL = 0  # kvp_head_role: keeps what the policy keeps (issue 32 item 2)
HEAD_STREAMING = 1  # kvp_head_role: keeps its first duo_sink and its duo_window newest tokens


def _role_table(roles):
    """A role table as (pointer, length) for kvp_create_heads (NULL, 0: none)."""
    if roles is None:
        return None, 0
    r = [int(x) for x in roles]
    if not r:
        return None, 0
    if any(x < 0 or x > 255 for x in r):
        raise _arg_error("a role must be 0..255 (0 retrieval, 1 streaming)")
    return (ctypes.c_uint8 * len(r))(*r), _uint32(len(r), "len(roles)")


class _Parallel:
    """A host's parallel-for given to Cache.set_parallel, and the kvp_parallel_fn around it (kept
    alive by the Cache while the library holds it)."""

    def __init__(self, fn):
        self.fn = fn
        self.error = None  # what fn raised in the current call; Cache._check raises it
        self.c_fn = _PARALLEL_FN(self._call)

    def _call(self, user, n, task, arg):
        # Nothing may propagate into C (ctypes would print it and return early): fn's exception is
        # kept for the Cache method that made the call, and every t fn skipped runs here.
        cond = threading.Condition()
        state = [0] * n  # per t: 0 not started, 1 running, 2 done

        def claim(t):
            with cond:
                if state[t]:
                    return False
                state[t] = 1
                return True

        def run_task(t):
            try:
                task(arg, t)
            finally:
                with cond:
                    state[t] = 2
                    cond.notify_all()

        def run(t):
            t = operator.index(t)
            if not 0 <= t < n:
                raise IndexError("kvprune: parallel task %d of %d (t must be < n)" % (t, n))
            if not claim(t):
                raise RuntimeError("kvprune: parallel task %d of %d run twice, or after the function returned"
                                   % (t, n))
            run_task(t)

        try:
            self.fn(n, run)
        except BaseException as e:  # noqa: B902 - nothing may unwind into C
            self.error = e
        for t in range(n):
            if claim(t):
                run_task(t)
        with cond:  # tasks started on threads fn did not wait for
            cond.wait_for(lambda: all(s == 2 for s in state))


class Cache:
    """A KV cache in its own arena (an anonymous mapping). Calls on one Cache are serialised by a lock."""

    def __init__(self, model, spec="", config=None, rope_freqs=None, roles=None):
        """rope_freqs: the RoPE inverse frequency of each rotated pair (rope_dim/2 floats, e.g. from
        rope_freqs_yarn), copied into the arena (kvp_create_rope); None = the model's theta.
        roles: a DuoAttention role table (kvp_create_heads: HEAD_RETRIEVAL or HEAD_STREAMING per
        layer and KV head, layer-major); None = none."""
        lib = load_library()
        cfg = config if config is not None else Config(model, spec)
        self.model = cfg.model
        self._handle = None
        self._parallel = None  # set_parallel's function
        self._lock = threading.Lock()
        rtab, rn = _role_table(roles)
        tab, nt = _rope_table(rope_freqs)
        n = cfg.arena_size_heads(roles) if rn else cfg.arena_size()
        if n == 0 and rn:  # the library's message: its checks fail before anything is allocated
            h = _CP()
            err = ctypes.create_string_buffer(_ERR_LEN)
            st = lib.kvp_create_heads(ctypes.byref(cfg._raw), tab, nt, rtab, rn, None, 0, ctypes.byref(h), err, _ERR_LEN)
            _check_buf(st, err)
            lib.kvp_destroy(h)
        if n == 0:
            cfg.check()
            raise _error(ERR_CONFIG, "invalid configuration")
        # Arena: an anonymous mapping (page-aligned, untouched until kvp_create writes it), from
        # 2 MiB on advised for huge pages first (kvp_arena_advise: a hint; refused, the arena works
        # with small pages); this object keeps it alive.
        self._buf = mmap.mmap(-1, n)
        self._arena = ctypes.addressof(ctypes.c_char.from_buffer(self._buf))
        if n >= 2 << 20:
            lib.kvp_arena_advise(ctypes.c_void_p(self._arena), n)
        self.arena_len = n
        h = _CP()
        err = ctypes.create_string_buffer(_ERR_LEN)
        st = lib.kvp_create_heads(ctypes.byref(cfg._raw), tab, nt, rtab, rn, ctypes.c_void_p(self._arena), n,
                                  ctypes.byref(h), err, _ERR_LEN)
        _check_buf(st, err)
        self._lib = lib
        self._handle = h
        # Widths from the C struct the cache was made from (not the Python Model, whose fields a
        # caller may change afterwards): tensors are checked against what the library will read.
        rm = cfg._raw.model
        self._qw = rm.n_q_heads * rm.head_dim
        self._kw = rm.n_kv_heads * rm.head_dim
        self._hd = rm.head_dim

    # -- life cycle --
    def close(self):
        """Destroys the cache (idempotent); the arena is released with this object."""
        h = getattr(self, "_handle", None)
        if h is not None:
            with self._lock:
                if self._handle is not None:
                    self._lib.kvp_destroy(self._handle)
                    self._handle = None
                    self._parallel = None  # after kvp_destroy: the library no longer calls it

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self):
        if self._handle is None:
            raise _error(ERR_STATE, "cache is closed")
        return self._handle

    def _check(self, st):
        p = self._parallel
        if p is not None and p.error is not None:  # set_parallel's function raised during the call
            e, p.error = p.error, None
            raise e
        if st != OK:
            raise KvpError(st, self._lib.kvp_last_error(self._handle).decode("utf-8", "replace"))

    def _new_out(self, n, like):
        if _is_numpy(like):  # same shape as the query: (n_q*hd,), (n_q, hd), (tokens, n_q, hd), ...
            shape = like.shape if like.size == n else (n,)
            return _np.zeros(shape, dtype=_np.float32)
        return array.array("f", bytes(4 * n))

    def _tokens(self, kn, vn, qn=None):
        if kn == 0 or kn % self._kw:
            raise _arg_error("k has %d floats: expected a positive multiple of n_kv_heads*head_dim = %d"
                             % (kn, self._kw))
        n = kn // self._kw
        if vn != kn:
            raise _arg_error("v has %d floats, k has %d" % (vn, kn))
        if qn is not None and qn != n * self._qw:
            raise _arg_error("q has %d floats, expected %d (%d tokens)" % (qn, n * self._qw, n))
        return n

    # -- calls --
    def decode(self, layer, q, k, v, out=None):
        """Decodes one token of ``layer``; returns ``out`` (new array('f'), or for a numpy q a numpy
        array of q's shape)."""
        layer = _index(layer, "layer")
        qa, qk, qn = _as_floats(q, "q")
        ka, kk, kn = _as_floats(k, "k")
        va, vk, vn = _as_floats(v, "v")
        n = self._tokens(kn, vn, qn)
        if n != 1:
            raise _arg_error("decode takes one token, k holds %d" % n)
        if out is None:
            out = self._new_out(self._qw, q)
        oa, ok_, on = _as_floats(out, "out", writable=True)
        if on != self._qw:
            raise _arg_error("out has %d floats, expected %d" % (on, self._qw))
        with self._lock:
            self._check(self._lib.kvp_decode(self._h(), layer, _fp(qa), _fp(ka), _fp(va), _fp(oa)))
        return out

    def prefill(self, layer, q, k, v, positions=None, out=True, selection=0):
        """Prefills a chunk (token count from k). ``out``: True (default) returns a new output
        array, None/False skips attention output, or a writable float32 buffer to fill. A numpy q
        gives a numpy output of q's shape. Chunk a long prompt by prefill_room(). ``selection`` > 0
        is prefill_select(..., capacity=selection) (kept for older callers)."""
        if selection:
            return self.prefill_select(layer, q, k, v, selection, positions=positions, out=out)
        return self._prefill(layer, q, k, v, positions, out, None)[0]

    def prefill_select(self, layer, q, k, v, capacity, positions=None, out=True):
        """prefill that also receives the ASL selection (kvp_selection) into a buffer of ``capacity``
        indices: returns (out, Selection(selected, indices)). A capacity below what the call needs
        is KvpError ERR_BUFFER (nothing changed)."""
        return self._prefill(layer, q, k, v, positions, out, capacity)

    def _prefill(self, layer, q, k, v, positions, out, selection):
        layer = _index(layer, "layer")
        if selection is not None:
            try:
                if isinstance(selection, bool):
                    raise TypeError
                selection = operator.index(selection)
            except TypeError:
                raise _arg_error("selection capacity %r is not an integer" % (selection,))
            if not 0 <= selection <= _U32_MAX:
                raise _arg_error("selection capacity %r is out of range (0..%d)" % (selection, _U32_MAX))
        qa, qk, qn = _as_floats(q, "q")
        ka, kk, kn = _as_floats(k, "k")
        va, vk, vn = _as_floats(v, "v")
        n = self._tokens(kn, vn, qn)
        pa = _positions(positions, n)
        if out is True:
            out = self._new_out(n * self._qw, q)
        elif out is False:
            out = None
        oa, ok_, on = _as_floats(out, "out", writable=True)
        if out is not None and on != n * self._qw:
            raise _arg_error("out has %d floats, expected %d (%d tokens)" % (on, n * self._qw, n))
        sel = idx = None
        if selection is not None:
            idx = (ctypes.c_int32 * max(selection, 1))()
            sel = _Selection(ctypes.sizeof(_Selection), selection, ctypes.cast(idx, _IP), 0, 0)
        with self._lock:
            self._check(self._lib.kvp_prefill(self._h(), layer, n, ctypes.cast(pa, _IP) if pa is not None else None,
                                              _fp(qa), _fp(ka), _fp(va), _fp(oa),
                                              ctypes.byref(sel) if sel is not None else None))
        if sel is not None:
            return out, Selection(bool(sel.selected), list(idx[:min(sel.n, selection)]))
        return out, None

    def append(self, layer, k, v, positions=None):
        """Stores tokens without attention (position-based pruning still applies)."""
        layer = _index(layer, "layer")
        ka, kk, kn = _as_floats(k, "k")
        va, vk, vn = _as_floats(v, "v")
        n = self._tokens(kn, vn)
        pa = _positions(positions, n)
        with self._lock:
            self._check(self._lib.kvp_append(self._h(), layer, n, ctypes.cast(pa, _IP) if pa is not None else None,
                                             _fp(ka), _fp(va)))

    # -- half-precision rows (kvp_*_ex) --
    def _new_half_out(self, n, like, dt):
        if _is_numpy(like):
            shape = like.shape if like.size == n else (n,)
            return _np.zeros(shape, dtype=like.dtype)
        return array.array("H", bytes(2 * n))

    def decode_half(self, layer, q, k, v, dtype="f16", out=None):
        """decode with q, k, v and out of 2-byte elements (kvp_decode_ex): ``dtype`` 'f16' (IEEE
        half; numpy float16 works) or 'bf16' (bfloat16 bits in uint16). Returns ``out`` (new: numpy
        of q's dtype and shape for a numpy q, else array('H') of the bits)."""
        layer = _index(layer, "layer")
        dt = _half_dtype(dtype)
        qa, qk, qn = _as_halves(q, "q", dt)
        ka, kk, kn = _as_halves(k, "k", dt)
        va, vk, vn = _as_halves(v, "v", dt)
        n = self._tokens(kn, vn, qn)
        if n != 1:
            raise _arg_error("decode takes one token, k holds %d" % n)
        if out is None:
            out = self._new_half_out(self._qw, q, dt)
        oa, ok_, on = _as_halves(out, "out", dt, writable=True)
        if on != self._qw:
            raise _arg_error("out has %d elements, expected %d" % (on, self._qw))
        with self._lock:
            self._check(self._lib.kvp_decode_ex(self._h(), layer, dt, _vp(qa), _vp(ka), _vp(va), _vp(oa)))
        return out

    def prefill_half(self, layer, q, k, v, dtype="f16", positions=None, out=True):
        """prefill with 2-byte rows (kvp_prefill_ex; see decode_half). ``out`` as in prefill."""
        layer = _index(layer, "layer")
        dt = _half_dtype(dtype)
        qa, qk, qn = _as_halves(q, "q", dt)
        ka, kk, kn = _as_halves(k, "k", dt)
        va, vk, vn = _as_halves(v, "v", dt)
        n = self._tokens(kn, vn, qn if q is not None else None)
        pa = _positions(positions, n)
        if out is True:
            out = self._new_half_out(n * self._qw, q, dt) if q is not None else None
        elif out is False:
            out = None
        oa, ok_, on = _as_halves(out, "out", dt, writable=True)
        if out is not None and on != n * self._qw:
            raise _arg_error("out has %d elements, expected %d (%d tokens)" % (on, n * self._qw, n))
        with self._lock:
            self._check(self._lib.kvp_prefill_ex(self._h(), layer, n, ctypes.cast(pa, _IP) if pa is not None else None,
                                                 dt, _vp(qa), _vp(ka), _vp(va), _vp(oa), None))
        return out

    def append_half(self, layer, k, v, dtype="f16", positions=None):
        """append with 2-byte rows (kvp_append_ex; see decode_half)."""
        layer = _index(layer, "layer")
        dt = _half_dtype(dtype)
        ka, kk, kn = _as_halves(k, "k", dt)
        va, vk, vn = _as_halves(v, "v", dt)
        n = self._tokens(kn, vn)
        pa = _positions(positions, n)
        with self._lock:
            self._check(self._lib.kvp_append_ex(self._h(), layer, n, ctypes.cast(pa, _IP) if pa is not None else None,
                                                dt, _vp(ka), _vp(va)))

    def layer_len(self, layer):
        layer = _index(layer, "layer")
        with self._lock:
            return self._lib.kvp_layer_len(self._h(), layer)

    def layer_positions(self, layer, kv_head):
        """Original positions kept by (layer, kv_head), ascending, as a list."""
        layer = _index(layer, "layer")
        kv_head = _index(kv_head, "kv_head")
        with self._lock:
            h = self._h()
            n = _u32(0)
            st = self._lib.kvp_layer_positions(h, layer, kv_head, None, 0, ctypes.byref(n))
            if st not in (OK, ERR_BUFFER):
                self._check(st)
            buf = (ctypes.c_int32 * max(n.value, 1))()
            self._check(self._lib.kvp_layer_positions(h, layer, kv_head, ctypes.cast(buf, _IP), n.value,
                                                      ctypes.byref(n)))
            return list(buf[:n.value])

    def layer_capacity(self, layer):
        """Token slots of ``layer`` per KV head (kvp_layer_capacity); 0 for a layer the cache lacks."""
        layer = _index(layer, "layer")
        with self._lock:
            return self._lib.kvp_layer_capacity(self._h(), layer)

    def prefill_room(self):
        """The largest prefill chunk that fits every layer from the current state (kvp_prefill_room):
        chunk a long prompt by it."""
        with self._lock:
            return self._lib.kvp_prefill_room(self._h())

    def layer_stats(self, layer):
        """kvp_get_layer_stats of ``layer`` as a LayerStats."""
        layer = _index(layer, "layer")
        s = _LayerStats()
        s.struct_size = ctypes.sizeof(_LayerStats)
        with self._lock:
            self._check(self._lib.kvp_get_layer_stats(self._h(), layer, ctypes.byref(s)))
        return LayerStats(s.capacity, s.len, s.live_bytes, s.prune_events, s.tokens_evicted, s.evict_threshold,
                          s.sparsity, s.lazy, s.prompt_early)

    def stats(self):
        s = _Stats()
        s.struct_size = ctypes.sizeof(_Stats)
        with self._lock:
            self._check(self._lib.kvp_get_stats(self._h(), ctypes.byref(s)))
        return Stats(s.arena_bytes, s.live_bytes, s.peak_live_bytes, s.tokens_seen, s.prune_events,
                     s.tokens_evicted)

    def reset(self):
        with self._lock:
            self._check(self._lib.kvp_reset(self._h()))

    def query_stats_set(self, layer, q_head, mean, abs_mean):
        """kvp_query_stats_set: TriAttention's query statistics of (layer, q_head) for
        tri_stats=given: ``mean`` the mean of each pre-RoPE query channel (head_dim floats),
        ``abs_mean`` the mean magnitude of each unit (RoPE pairs, then each unrotated channel)."""
        layer = _index(layer, "layer")
        q_head = _index(q_head, "q_head")
        ma, mk, mn = _as_floats(mean, "mean")
        aa, ak, an = _as_floats(abs_mean, "abs_mean")
        if mn != self._hd:
            raise _arg_error("mean has %d floats, expected head_dim %d" % (mn, self._hd))
        with self._lock:
            self._check(self._lib.kvp_query_stats_set(self._h(), layer, q_head, _fp(ma), _fp(aa), an))

    # -- the host's threads (issue 30) --
    def set_parallel(self, fn):
        """kvp_set_parallel: hands the cache's parallel work to the host's threads. From now on
        every call that would use k > 1 of the cache's ``threads`` calls ``fn(k, run)`` on the
        calling thread instead of waking the cache's own workers; ``fn`` must call ``run(t)`` once
        for each t in range(k), on any threads (e.g. threading.Thread, joined before it returns, or
        in a row: run releases the GIL while the library works), and return after all of them
        returned. Outputs are bit-identical whichever thread runs which t. A t that fn skips runs
        after fn returns; run(t) with t outside range(k) or a t that already ran raises. What fn
        raises is raised by the Cache method that called it, after the library's call completed.
        fn must not call this cache's methods (their lock is held). ``None`` restores the default:
        the cache's own workers (thread_pool=own) or the caller alone (thread_pool=host, the
        configuration that starts no workers). With threads=1, fn is never called. ERR_UNSUPPORTED
        from a library built without threads."""
        p = _Parallel(fn) if fn is not None else None
        with self._lock:
            self._check(self._lib.kvp_set_parallel(self._h(), p.c_fn if p is not None else _PARALLEL_FN(), None))
            self._parallel = p  # the one it replaced is no longer called

    # -- speculative decoding (issue 21) --
    def prompt_end(self):
        """kvp_prompt_end: ends the prompt (config max_prompt > 0): every layer holding an open
        prompt selects from the whole prompt now, as one prefill of it would. Without an open
        prompt nothing happens; with a draft open it raises (KVP_ERR_STATE)."""
        with self._lock:
            self._check(self._lib.kvp_prompt_end(self._h()))

    def draft_begin(self):
        """kvp_draft_begin: opens a draft (needs max_draft > 0). Until draft_commit, prefill and
        decode only append draft tokens and attend."""
        with self._lock:
            self._check(self._lib.kvp_draft_begin(self._h()))

    def draft_commit(self, accepted):
        """kvp_draft_commit: keeps the first ``accepted`` draft tokens of every layer, drops the
        rest, leaving the cache as one prefill of exactly those tokens would have. No open draft is
        ERR_STATE; more than a layer drafted (or not a uint32) is ERR_ARG, the draft stays open."""
        if isinstance(accepted, bool) or not isinstance(accepted, int) or not 0 <= accepted <= _U32_MAX:
            raise _arg_error("accepted %r is not an integer in 0..%d" % (accepted, _U32_MAX))
        with self._lock:
            self._check(self._lib.kvp_draft_commit(self._h(), accepted))

    # -- state save/load (issue 21) --
    def state_size(self):
        """kvp_state_size: bytes state_save writes now (0 while the cache cannot be saved)."""
        with self._lock:
            return self._lib.kvp_state_size(self._h())

    def state_save(self, buf=None):
        """kvp_state_save (the library allocates nothing). With ``buf`` (a writable bytes-like
        object: bytearray, memoryview, numpy array) the state is written into it and the byte count
        is returned (the state is buf[:n]); a too small buf is ERR_BUFFER with buf untouched. With
        no buf, returns the state as new ``bytes``. An open draft is ERR_STATE. The cache is never
        changed."""
        if buf is None:
            with self._lock:
                n = self._lib.kvp_state_size(self._h())
                out = bytearray(max(n, 1))
                written = ctypes.c_size_t(0)
                raw = (ctypes.c_char * len(out)).from_buffer(out)
                self._check(self._lib.kvp_state_save(self._h(), ctypes.addressof(raw), n, ctypes.byref(written)))
                del raw
            return bytes(out[:written.value])
        try:
            mv = memoryview(buf).cast("B")
        except TypeError:
            raise _arg_error("buf must be a contiguous bytes-like object, got %s" % type(buf).__name__)
        if mv.readonly:
            raise _arg_error("buf is read-only")
        size = mv.nbytes
        raw = (ctypes.c_char * max(size, 1)).from_buffer(mv) if size else (ctypes.c_char * 1)()
        written = ctypes.c_size_t(0)
        try:
            with self._lock:
                self._check(self._lib.kvp_state_save(self._h(), ctypes.addressof(raw), size, ctypes.byref(written)))
        finally:
            del raw
            mv.release()
        return written.value

    def state_load(self, buf):
        """kvp_state_load: replaces the cache's state with one state_save wrote from a cache of the
        same configuration (``buf`` any bytes-like object). A truncated, corrupted or foreign state
        is an error (ERR_ARG, ERR_CONFIG, ERR_UNSUPPORTED) and the cache is unchanged."""
        if isinstance(buf, bytes):
            keep = buf
            size = len(buf)
            ptr = ctypes.cast(ctypes.c_char_p(buf), ctypes.c_void_p) if size else None
        else:
            try:
                mv = memoryview(buf).cast("B")
            except TypeError:
                raise _arg_error("buf must be a contiguous bytes-like object, got %s" % type(buf).__name__)
            keep = bytes(mv) if mv.readonly else mv
            size = len(keep)
            ptr = None
            if size:
                if isinstance(keep, bytes):
                    ptr = ctypes.cast(ctypes.c_char_p(keep), ctypes.c_void_p)
                else:
                    raw = (ctypes.c_char * size).from_buffer(keep)
                    ptr = ctypes.addressof(raw)
        if ptr is None:
            one = (ctypes.c_char * 1)()  # an empty buffer: a valid pointer, size 0 (ERR_ARG: not a state)
            ptr = ctypes.addressof(one)
        with self._lock:
            self._check(self._lib.kvp_state_load(self._h(), ptr, size))
        del keep

    def last_error(self):
        """Message of the last failed library call on this cache ("" if none)."""
        with self._lock:
            return self._lib.kvp_last_error(self._h()).decode("utf-8", "replace")

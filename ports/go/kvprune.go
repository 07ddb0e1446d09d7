// Package kvprune binds the kvprune C ABI (include/kvprune/kvprune.h): an arena-backed KV
// cache that computes attention itself and prunes what it keeps according to a policy.
//
//	c, err := kvprune.NewCache(kvprune.Model{Layers: 2, QHeads: 4, KVHeads: 2, HeadDim: 64,
//		Rope: kvprune.RopeNeox, RopeTheta: 10000}, "policy=streaming sinks=4 window=252")
//	if err != nil { ... }
//	defer c.Close()
//	err = c.Decode(layer, q, k, v, out) // q, out: QHeads*HeadDim floats; k, v: KVHeads*HeadDim
//
// The library is found with pkg-config (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig after
// `cmake --install`). The arena is C memory (aligned_alloc: 64 bytes, or whole 2 MiB pages
// advised for huge pages from 2 MiB on, kvp_arena_advise) because the cache keeps pointers into
// it across calls, which cgo forbids for Go memory; Close (or the finalizer) destroys the cache
// and frees it. A Cache serialises its calls with a mutex.
package kvprune

/*
#cgo pkg-config: kvprune
#include <stdlib.h>
#include <kvprune/kvprune.h>

// 64-byte aligned; from 2 MiB on whole 2 MiB pages (arenaAlloc advises them)
static void *kvp_go_arena(size_t n) {
	const size_t huge = (size_t)2 << 20, al = n >= huge ? huge : 64;
	if (n > SIZE_MAX - al) return NULL;
	size_t r = (n + al - 1) & ~(al - 1);
	return aligned_alloc(al, r ? r : al);
}

// The host's parallel-for (kvp_set_parallel): cgo cannot call a C function pointer, so the
// library's task is called here; kvp_go_parallel is the kvp_parallel_fn, and its `user` is an
// integer (a registry id, never a Go pointer). The definitions are static: this file has an
// //export, so the preamble is compiled twice.
extern void kvpGoParallel(uintptr_t id, uint32_t n, void *task, void *arg);
static void kvp_go_parallel(void *user, uint32_t n, void (*task)(void *arg, uint32_t t), void *arg) {
	kvpGoParallel((uintptr_t)user, n, (void *)task, arg);
}
static void kvp_go_run_task(void *task, void *arg, uint32_t t) {
	((void (*)(void *, uint32_t))task)(arg, t);
}
static kvp_parallel_fn kvp_go_parallel_fn(void) { return kvp_go_parallel; }
static void *kvp_go_user(uintptr_t id) { return (void *)id; }
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Status is a kvp_status value; the numbers are pinned by the C ABI.
type Status int

const (
	OK             Status = C.KVP_OK
	ErrArg         Status = C.KVP_ERR_ARG
	ErrConfig      Status = C.KVP_ERR_CONFIG
	ErrArena       Status = C.KVP_ERR_ARENA
	ErrLayer       Status = C.KVP_ERR_LAYER
	ErrFull        Status = C.KVP_ERR_FULL
	ErrNonFinite   Status = C.KVP_ERR_NONFINITE
	ErrState       Status = C.KVP_ERR_STATE
	ErrUnsupported Status = C.KVP_ERR_UNSUPPORTED
	ErrBuffer      Status = C.KVP_ERR_BUFFER
)

// String is the library's name and meaning of the status (kvp_status_str).
func (s Status) String() string { return C.GoString(C.kvp_status_str(C.kvp_status(s))) }

// Error is a failed call: the status and the library's (or the binding's) message. Messages
// have the library's one format, "<status>: <detail>" (e.g. "KVP_ERR_LAYER: layer or head out of
// range: layer 7 ..."), so Error() returns the message as it is.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Status.String()
	}
	return e.Message
}

// newError is an error of this binding in the library's format.
func newError(s Status, format string, a ...interface{}) *Error {
	return &Error{Status: s, Message: s.String() + ": " + fmt.Sprintf(format, a...)}
}

// u32 converts a Go int index to the C ABI's uint32_t, rejecting values that would wrap
// (a layer 1<<32 must not become layer 0).
func u32(what string, v int) (C.uint32_t, error) {
	if v < 0 || uint64(v) > math.MaxUint32 {
		return 0, newError(ErrLayer, "%s %d is out of range (0..%d)", what, v, uint64(math.MaxUint32))
	}
	return C.uint32_t(v), nil
}

// Is lets errors.Is(err, kvprune.ErrFull) etc. match on the status.
func (e *Error) Is(target error) bool {
	if t, ok := target.(*Error); ok {
		return t.Message == "" && t.Status == e.Status
	}
	if s, ok := target.(Status); ok {
		return s == e.Status
	}
	return false
}

// Error makes a Status usable as a sentinel: errors.Is(err, kvprune.ErrFull).
func (s Status) Error() string { return s.String() }

// StatusOf returns the status of an error from this package (OK for nil, -1 for others).
func StatusOf(err error) Status {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return -1
}

// Rope is the RoPE style.
type Rope int

const (
	RopeNone Rope = C.KVP_ROPE_NONE
	RopeNeox Rope = C.KVP_ROPE_NEOX // rotates (i, i+rope_dim/2)
	RopeGptj Rope = C.KVP_ROPE_GPTJ // rotates (2i, 2i+1), as llama2.c
)

// The pinned numbers of the C enums kvp_policy, kvp_positions, kvp_dtype, kvp_score_mode and
// kvp_pool (values of Config.Get/Set for enum keys).
const (
	PolicyFull         = C.KVP_POLICY_FULL
	PolicyWindow       = C.KVP_POLICY_WINDOW
	PolicyStreaming    = C.KVP_POLICY_STREAMING
	PolicyH2O          = C.KVP_POLICY_H2O
	PolicySnapKV       = C.KVP_POLICY_SNAPKV
	PolicyPyramidKV    = C.KVP_POLICY_PYRAMIDKV
	PolicyLethe        = C.KVP_POLICY_LETHE
	PolicySimLayerKV   = C.KVP_POLICY_SIMLAYERKV
	PolicyASL          = C.KVP_POLICY_ASL
	PolicyThink        = C.KVP_POLICY_THINK
	PolicyRandom       = C.KVP_POLICY_RANDOM
	PolicyTriAttention = C.KVP_POLICY_TRIATTENTION

	PosDefault  = C.KVP_POS_DEFAULT
	PosOriginal = C.KVP_POS_ORIGINAL
	PosRealign  = C.KVP_POS_REALIGN

	DtypeF32 = C.KVP_DTYPE_F32
	DtypeF16 = C.KVP_DTYPE_F16
	DtypeQ8  = C.KVP_DTYPE_Q8
	DtypeQ4  = C.KVP_DTYPE_Q4

	ScoreFloat = C.KVP_SCORE_FLOAT
	ScoreFixed = C.KVP_SCORE_FIXED

	PoolAvg = C.KVP_POOL_AVG
	PoolMax = C.KVP_POOL_MAX

	ThreadPoolOwn  = C.KVP_THREAD_POOL_OWN  // thread_pool=own: the cache starts threads-1 workers
	ThreadPoolHost = C.KVP_THREAD_POOL_HOST // thread_pool=host: none; SetParallel gives the host's
)

// Model is the geometry (kvp_model). RopeDim 0 means HeadDim.
type Model struct {
	Layers, QHeads, KVHeads, HeadDim uint32
	Rope                             Rope
	RopeDim                          uint32
	RopeTheta                        float32
}

func (m Model) raw() C.kvp_model {
	return C.kvp_model{
		n_layers: C.uint32_t(m.Layers), n_q_heads: C.uint32_t(m.QHeads),
		n_kv_heads: C.uint32_t(m.KVHeads), head_dim: C.uint32_t(m.HeadDim),
		rope: C.kvp_rope_style(m.Rope), rope_dim: C.uint32_t(m.RopeDim), rope_theta: C.float(m.RopeTheta),
	}
}

// Version returns the linked library's (major, minor, patch).
func Version() (int, int, int) {
	v := uint32(C.kvp_version())
	return int(v >> 16), int(v >> 8 & 0xff), int(v & 0xff)
}

const errLen = 512

func errFromBuf(s C.kvp_status, buf []byte) error {
	if s == C.KVP_OK {
		return nil
	}
	msg := string(buf)
	if i := strings.IndexByte(msg, 0); i >= 0 {
		msg = msg[:i]
	}
	return &Error{Status: Status(s), Message: msg}
}

// Config is a kvp_config value: defaults for a model, changed by spec strings.
type Config struct {
	raw C.kvp_config
}

// NewConfig returns the defaults for m (kvp_config_init_ex with this binding's struct size) with
// spec applied ("" for none). A bad geometry is an ErrConfig error whose message names the field,
// e.g. "model.n_kv_heads=4 must divide model.n_q_heads=6".
func NewConfig(m Model, spec string) (*Config, error) {
	cfg := &Config{}
	mr := m.raw()
	buf := make([]byte, errLen)
	s := C.kvp_config_init_ex(&cfg.raw, C.uint32_t(unsafe.Sizeof(cfg.raw)), &mr, (*C.char)(unsafe.Pointer(&buf[0])), errLen)
	if err := errFromBuf(s, buf); err != nil {
		return nil, err
	}
	if spec != "" {
		if err := cfg.Apply(spec); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// Apply applies a spec ("policy=streaming sinks=4 window=1020"), all-or-nothing.
func (cfg *Config) Apply(spec string) error {
	if strings.IndexByte(spec, 0) >= 0 {
		return newError(ErrArg, "spec contains a NUL byte")
	}
	cs := C.CString(spec)
	defer C.free(unsafe.Pointer(cs))
	buf := make([]byte, errLen)
	s := C.kvp_config_apply(&cfg.raw, cs, (*C.char)(unsafe.Pointer(&buf[0])), errLen)
	return errFromBuf(s, buf)
}

// Check validates the whole configuration (kvp_config_check).
func (cfg *Config) Check() error {
	buf := make([]byte, errLen)
	s := C.kvp_config_check(&cfg.raw, (*C.char)(unsafe.Pointer(&buf[0])), errLen)
	return errFromBuf(s, buf)
}

// RopeCheck checks a RoPE table (rope_dim/2 inverse frequencies, each finite and > 0) against the
// configuration without creating anything (kvp_rope_check); nil or empty means no table.
func (cfg *Config) RopeCheck(invFreq []float64) error {
	if len(invFreq) > math.MaxUint32 {
		return newError(ErrArg, "the RoPE table has more than 2^32-1 entries")
	}
	var tab *C.double
	if len(invFreq) > 0 {
		tab = (*C.double)(unsafe.Pointer(&invFreq[0]))
	}
	buf := make([]byte, errLen)
	s := C.kvp_rope_check(&cfg.raw, tab, C.uint32_t(len(invFreq)), (*C.char)(unsafe.Pointer(&buf[0])), errLen)
	return errFromBuf(s, buf)
}

// ArenaSize is the exact arena size in bytes; 0 when the configuration is invalid.
func (cfg *Config) ArenaSize() int { return int(C.kvp_arena_size(&cfg.raw)) }

// Head roles of a DuoAttention role table (kvp_head_role, issue 32 item 2).
const (
	HeadRetrieval uint8 = 0 // keeps what the policy keeps
	HeadStreaming uint8 = 1 // keeps its first duo_sink and its duo_window newest tokens
)

// ArenaSizeHeads is kvp_arena_size_heads: the exact arena bytes with a role table
// (roles[layer*n_kv_heads+h]); 0 if the config or the table is invalid or unsupported.
func (cfg *Config) ArenaSizeHeads(roles []uint8) int {
	if len(roles) > math.MaxUint32 {
		return 0
	}
	var rp *C.uint8_t
	if len(roles) > 0 {
		rp = (*C.uint8_t)(unsafe.Pointer(&roles[0]))
	}
	return int(C.kvp_arena_size_heads(&cfg.raw, rp, C.uint32_t(len(roles))))
}

// StructSize is kvp_config.struct_size as the C library wrote it.
func (cfg *Config) StructSize() uint32 { return uint32(cfg.raw.struct_size) }

// Capacity, Policy, Threads, Sinks, Window: a few fields, read back.
func (cfg *Config) Capacity() uint32 { return uint32(cfg.raw.capacity) }
func (cfg *Config) Policy() int      { return int(cfg.raw.policy) }
func (cfg *Config) Threads() uint32  { return uint32(cfg.raw.threads) }
func (cfg *Config) Sinks() uint32    { return uint32(cfg.raw.sinks) }
func (cfg *Config) Window() uint32   { return uint32(cfg.raw.window) }

// Model returns the geometry.
func (cfg *Config) Model() Model {
	m := cfg.raw.model
	return Model{Layers: uint32(m.n_layers), QHeads: uint32(m.n_q_heads), KVHeads: uint32(m.n_kv_heads),
		HeadDim: uint32(m.head_dim), Rope: Rope(m.rope), RopeDim: uint32(m.rope_dim), RopeTheta: float32(m.rope_theta)}
}

// KeyUsed reports whether key name affects a cache of this configuration
// (kvp_config_key_used); an unknown key is an ErrConfig error.
func (cfg *Config) KeyUsed(name string) (bool, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return false, newError(ErrConfig, "unknown key %q", name)
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	r := C.kvp_config_key_used(&cfg.raw, cs)
	if r < 0 {
		return false, newError(ErrConfig, "unknown key %q", name)
	}
	return r != 0, nil
}

// field returns the key table row of name and a pointer to its field in cfg.raw: every field
// after model is 32 bits, in key table order, so the field ends at the row's config_size.
func (cfg *Config) field(name string) (C.kvp_key_info, unsafe.Pointer, error) {
	n := uint32(C.kvp_config_key_count())
	for i := uint32(0); i < n; i++ {
		info, err := rawKey(i)
		if err != nil {
			return info, nil, err
		}
		if C.GoString(info.name) != name {
			continue
		}
		if info.config_size == 0 {
			return info, nil, newError(ErrConfig, "%s is an apply-only key (kvp_config_apply resolves it into other fields; nothing is stored): use Apply(\"%s=...\")", name, name)
		}
		size := uintptr(info.config_size)
		first := unsafe.Offsetof(cfg.raw.policy)
		if size > unsafe.Sizeof(cfg.raw) || size < first+4 {
			break // a key of a newer library than this binding's struct
		}
		return info, unsafe.Add(unsafe.Pointer(&cfg.raw), size-4), nil
	}
	return C.kvp_key_info{}, nil, newError(ErrConfig, "unknown key %q", name)
}

// Get returns the field of spec key name (uint and enum keys as whole numbers).
func (cfg *Config) Get(name string) (float64, error) {
	info, p, err := cfg.field(name)
	if err != nil {
		return 0, err
	}
	if info._type == C.KVP_KEY_FLOAT {
		return float64(*(*float32)(p)), nil
	}
	return float64(*(*uint32)(p)), nil
}

// Set sets the field of spec key name directly (no cross-field check: NewCacheFromConfig or
// Check does that). The value must be in the key's range from the key table (uint: a whole
// number in min..max; float: min..max; enum: a whole number 0..max, e.g. float64(PolicyH2O)),
// else an ErrConfig error and the field is unchanged: never truncated.
func (cfg *Config) Set(name string, value float64) error {
	info, p, err := cfg.field(name)
	if err != nil {
		return err
	}
	lo, hi := float64(info.min), float64(info.max)
	if info._type == C.KVP_KEY_FLOAT {
		if !(lo <= value && value <= hi) {
			return newError(ErrConfig, "%s=%v is out of range (%v..%v)", name, value, lo, hi)
		}
		*(*float32)(p) = float32(value)
		return nil
	}
	if value != math.Trunc(value) || math.IsInf(value, 0) {
		return newError(ErrConfig, "%s=%v is not an integer", name, value)
	}
	if info._type == C.KVP_KEY_ENUM {
		lo = 0
	}
	if !(lo <= value && value <= hi) {
		return newError(ErrConfig, "%s=%.0f is out of range (%.0f..%.0f)", name, value, lo, hi)
	}
	*(*uint32)(p) = uint32(value)
	return nil
}

// KeyType is the value type of a configuration key (kvp_key_type).
type KeyType int

const (
	KeyUint  KeyType = C.KVP_KEY_UINT
	KeyFloat KeyType = C.KVP_KEY_FLOAT
	KeyEnum  KeyType = C.KVP_KEY_ENUM
)

// KeyInfo is one row of the library's key table (kvp_config_key); KeyType is the C field type.
// Values ("avg|max") and DefaultName are "" for numeric keys; Policies has bit 1<<policy set
// for each policy that uses the key.
type KeyInfo struct {
	Name                   string
	KeyType                KeyType
	Min, Max, DefaultValue float64
	Values, DefaultName    string
	Policies, ConfigSize   uint32
	Help                   string
}

func rawKey(i uint32) (C.kvp_key_info, error) {
	var k C.kvp_key_info
	k.struct_size = C.uint32_t(unsafe.Sizeof(k))
	if s := C.kvp_config_key(C.uint32_t(i), &k); s != C.KVP_OK {
		return k, newError(Status(s), "kvp_config_key(%d) failed", i)
	}
	return k, nil
}

// ConfigKeys returns the library's configuration keys (kvp_config_key_count / kvp_config_key),
// in field order.
func ConfigKeys() ([]KeyInfo, error) {
	n := uint32(C.kvp_config_key_count())
	keys := make([]KeyInfo, 0, n)
	str := func(p *C.char) string {
		if p == nil {
			return ""
		}
		return C.GoString(p)
	}
	for i := uint32(0); i < n; i++ {
		k, err := rawKey(i)
		if err != nil {
			return nil, err
		}
		keys = append(keys, KeyInfo{Name: str(k.name), KeyType: KeyType(k._type), Min: float64(k.min),
			Max: float64(k.max), DefaultValue: float64(k.default_value), Values: str(k.values),
			DefaultName: str(k.default_name), Policies: uint32(k.policies), ConfigSize: uint32(k.config_size),
			Help: str(k.help)})
	}
	return keys, nil
}

// Stats are a cache's counters (kvp_stats).
type Stats struct {
	ArenaBytes, LiveBytes, PeakLiveBytes, TokensSeen, PruneEvents, TokensEvicted uint64
}

// Cache is a KV cache in its own C-allocated arena.
type Cache struct {
	mu       sync.Mutex
	c        *C.kvp_cache
	arena    unsafe.Pointer
	arenaLen int
	model    Model
	par      *hostParallel // SetParallel's function, registered under par.id; nil: none
}

// NewCache creates a cache for model m configured by spec.
func NewCache(m Model, spec string) (*Cache, error) {
	cfg, err := NewConfig(m, spec)
	if err != nil {
		return nil, err
	}
	return NewCacheFromConfig(cfg)
}

// NewCacheFromConfig allocates the exact arena and creates the cache in it.
func NewCacheFromConfig(cfg *Config) (*Cache, error) {
	return NewCacheRope(cfg, nil)
}

// arenaAlloc is a cache's C arena (kvp_go_arena), from 2 MiB on advised for huge pages before
// kvp_create writes it (kvp_arena_advise: a hint; where it is refused the arena works with small
// pages). nil when the allocation fails.
func arenaAlloc(n int) unsafe.Pointer {
	arena := C.kvp_go_arena(C.size_t(n))
	if huge := 2 << 20; arena != nil && n >= huge {
		C.kvp_arena_advise(arena, C.size_t((n+huge-1)/huge*huge))
	}
	return arena
}

// NewCacheRope is NewCacheFromConfig whose RoPE rotates pair i by pos*invFreq[i] (rope_dim/2
// entries, e.g. from RopeFreqsYarn; copied into the arena by kvp_create_rope). A nil or empty
// invFreq means the model's theta.
func NewCacheRope(cfg *Config, invFreq []float64) (*Cache, error) {
	var tab *C.double
	if len(invFreq) > math.MaxUint32 {
		return nil, newError(ErrArg, "the RoPE table has more than 2^32-1 entries")
	}
	if len(invFreq) > 0 {
		tab = (*C.double)(unsafe.Pointer(&invFreq[0]))
	}
	n := cfg.ArenaSize()
	if n == 0 {
		if err := cfg.Check(); err != nil {
			return nil, err
		}
		return nil, newError(ErrConfig, "invalid configuration")
	}
	arena := arenaAlloc(n)
	if arena == nil {
		return nil, newError(ErrArena, "cannot allocate %d bytes", n)
	}
	var h *C.kvp_cache
	buf := make([]byte, errLen)
	var s C.kvp_status
	if tab == nil { // no table: the plain create (kvp_create_rope with none is the same call)
		s = C.kvp_create_ex(&cfg.raw, arena, C.size_t(n), &h, (*C.char)(unsafe.Pointer(&buf[0])), errLen)
	} else {
		s = C.kvp_create_rope(&cfg.raw, tab, C.uint32_t(len(invFreq)), arena, C.size_t(n), &h,
			(*C.char)(unsafe.Pointer(&buf[0])), errLen)
	}
	if s != C.KVP_OK {
		C.free(arena)
		return nil, errFromBuf(s, buf)
	}
	c := &Cache{c: h, arena: arena, arenaLen: n, model: cfg.Model()}
	runtime.SetFinalizer(c, (*Cache).Close)
	return c, nil
}

// NewCacheHeads is kvp_create_heads: NewCacheRope with a DuoAttention role table
// (roles[layer*n_kv_heads+h], HeadRetrieval or HeadStreaming), copied into the cache. An empty
// roles is NewCacheRope.
func NewCacheHeads(cfg *Config, invFreq []float64, roles []uint8) (*Cache, error) {
	if len(roles) == 0 {
		return NewCacheRope(cfg, invFreq)
	}
	if len(invFreq) > math.MaxUint32 || len(roles) > math.MaxUint32 {
		return nil, newError(ErrArg, "the RoPE or role table has more than 2^32-1 entries")
	}
	var tab *C.double
	if len(invFreq) > 0 {
		tab = (*C.double)(unsafe.Pointer(&invFreq[0]))
	}
	rp := (*C.uint8_t)(unsafe.Pointer(&roles[0]))
	buf := make([]byte, errLen)
	n := cfg.ArenaSizeHeads(roles)
	if n == 0 { // the library's message: the checks fail before anything is allocated
		var h *C.kvp_cache
		s := C.kvp_create_heads(&cfg.raw, tab, C.uint32_t(len(invFreq)), rp, C.uint32_t(len(roles)), nil, 0, &h,
			(*C.char)(unsafe.Pointer(&buf[0])), errLen)
		if s != C.KVP_OK {
			return nil, errFromBuf(s, buf)
		}
		C.kvp_destroy(h)
		return nil, newError(ErrConfig, "invalid configuration or role table")
	}
	arena := arenaAlloc(n)
	if arena == nil {
		return nil, newError(ErrArena, "cannot allocate %d bytes", n)
	}
	var h *C.kvp_cache
	s := C.kvp_create_heads(&cfg.raw, tab, C.uint32_t(len(invFreq)), rp, C.uint32_t(len(roles)), arena, C.size_t(n), &h,
		(*C.char)(unsafe.Pointer(&buf[0])), errLen)
	if s != C.KVP_OK {
		C.free(arena)
		return nil, errFromBuf(s, buf)
	}
	c := &Cache{c: h, arena: arena, arenaLen: n, model: cfg.Model()}
	runtime.SetFinalizer(c, (*Cache).Close)
	return c, nil
}

// Close destroys the cache and frees its arena. Safe to call more than once.
func (c *Cache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		C.kvp_destroy(c.c)
		C.free(c.arena)
		c.c, c.arena = nil, nil
		c.par = c.par.unregister() // after kvp_destroy: the library no longer calls it
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

// Model returns the geometry. ArenaLen the arena bytes.
func (c *Cache) Model() Model  { return c.model }
func (c *Cache) ArenaLen() int { return c.arenaLen }

var errClosed = newError(ErrState, "cache is closed")

func (c *Cache) lock() error {
	c.mu.Lock()
	if c.c == nil {
		c.mu.Unlock()
		return errClosed
	}
	return nil
}

// status turns a kvp_status into an error with the cache's message. Holds c.mu. A panic of the
// SetParallel function during the call (recovered before it could unwind through C, after every
// task ran) continues here, in the goroutine that made the call.
func (c *Cache) status(s C.kvp_status) error {
	if c.par != nil && c.par.panicked != nil {
		p := c.par.panicked
		c.par.panicked = nil
		panic(*p)
	}
	if s == C.KVP_OK {
		return nil
	}
	return &Error{Status: Status(s), Message: C.GoString(C.kvp_last_error(c.c))}
}

func argErr(format string, a ...interface{}) error {
	return newError(ErrArg, format, a...)
}

// tokens checks slice sizes and returns the token count (from k).
func (c *Cache) tokens(q []float32, checkQ bool, k, v, out []float32, positions []int32) (int, error) {
	return c.rowTokens("floats", len(q), checkQ, len(k), len(v), len(out), out != nil, len(positions), positions != nil)
}

// rowTokens checks the lengths of a token call's rows (in elements of `unit`) and returns the
// token count (from k): tokens for float rows, halfTokens for 2-byte rows.
func (c *Cache) rowTokens(unit string, lq int, checkQ bool, lk, lv, lout int, hasOut bool, lpos int, hasPos bool) (int, error) {
	kw := int(c.model.KVHeads * c.model.HeadDim)
	qw := int(c.model.QHeads * c.model.HeadDim)
	if lk == 0 || lk%kw != 0 {
		return 0, argErr("k has %d %s: expected a positive multiple of n_kv_heads*head_dim = %d", lk, unit, kw)
	}
	n := lk / kw
	if qw != 0 && n > int(^uint(0)>>1)/qw { // 32-bit targets: n*qw must not wrap (a short q would pass)
		return 0, argErr("%d tokens: q would hold more %s than int counts", n, unit)
	}
	if lv != lk {
		return 0, argErr("v has %d %s, k has %d", lv, unit, lk)
	}
	if checkQ && lq != n*qw {
		return 0, argErr("q has %d %s, expected %d (%d tokens)", lq, unit, n*qw, n)
	}
	if hasOut && lout != n*qw {
		return 0, argErr("out has %d %s, expected %d (%d tokens)", lout, unit, n*qw, n)
	}
	if hasPos && lpos != n {
		return 0, argErr("positions has %d entries, expected %d", lpos, n)
	}
	if uint64(n) > 0xffffffff {
		return 0, argErr("%d tokens in one call", n)
	}
	return n, nil
}

func fptr(x []float32) *C.float {
	if len(x) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&x[0]))
}

func iptr(x []int32) *C.int32_t {
	if len(x) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&x[0]))
}

// tokenCall is the frame of the token calls: the lock, the rows' token count (count checks
// the lengths), one token only for a decode, the layer, the C call, its status.
func (c *Cache) tokenCall(layer int, decode bool, count func() (int, error), call func(l, n C.uint32_t) C.kvp_status) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	n, err := count()
	if err != nil {
		return err
	}
	if decode && n != 1 {
		return argErr("decode takes one token, k holds %d", n)
	}
	l, err := u32("layer", layer)
	if err != nil {
		return err
	}
	s := call(l, C.uint32_t(n))
	runtime.KeepAlive(c)
	return c.status(s)
}

// Decode decodes one token of layer: q and out hold QHeads*HeadDim floats, k and v KVHeads*HeadDim.
func (c *Cache) Decode(layer int, q, k, v, out []float32) error {
	return c.tokenCall(layer, true, func() (int, error) {
		if out == nil {
			return 0, argErr("out is nil")
		}
		return c.tokens(q, true, k, v, out, nil)
	}, func(l, _ C.uint32_t) C.kvp_status {
		return C.kvp_decode(c.c, l, fptr(q), fptr(k), fptr(v), fptr(out))
	})
}

// Prefill appends a chunk of tokens (count from k) to layer with exact causal attention into
// out (nil: skipped), then applies the policy's prefill compression. positions nil = next ones.
func (c *Cache) Prefill(layer int, q, k, v []float32, positions []int32, out []float32) error {
	_, _, err := c.prefill(layer, q, k, v, positions, out, nil)
	return err
}

// PrefillSelect is Prefill that also receives the ASL selection into indices; it returns the
// number of indices written and whether this call determined the selection layer.
func (c *Cache) PrefillSelect(layer int, q, k, v []float32, positions []int32, out []float32, indices []int32) (int, bool, error) {
	if len(indices) == 0 {
		return 0, false, argErr("indices is empty")
	}
	return c.prefill(layer, q, k, v, positions, out, indices)
}

func (c *Cache) prefill(layer int, q, k, v []float32, positions []int32, out []float32, indices []int32) (int, bool, error) {
	if err := c.lock(); err != nil {
		return 0, false, err
	}
	defer c.mu.Unlock()
	n, err := c.tokens(q, true, k, v, out, positions)
	if err != nil {
		return 0, false, err
	}
	l, err := u32("layer", layer)
	if err != nil {
		return 0, false, err
	}
	if uint64(len(indices)) > math.MaxUint32 {
		return 0, false, argErr("%d indices do not fit in uint32", len(indices))
	}
	var selp *C.kvp_selection
	var cidx *C.int32_t
	if indices != nil {
		// Both in C memory: C may not hold Go pointers in C memory (cgo pointer rules), so the
		// selection struct and its index buffer are C-allocated and copied out afterwards.
		selp = (*C.kvp_selection)(C.calloc(1, C.size_t(unsafe.Sizeof(C.kvp_selection{}))))
		cidx = (*C.int32_t)(C.calloc(C.size_t(len(indices)), 4))
		defer C.free(unsafe.Pointer(selp))
		defer C.free(unsafe.Pointer(cidx))
		selp.struct_size = C.uint32_t(unsafe.Sizeof(C.kvp_selection{}))
		selp.capacity = C.uint32_t(len(indices))
		selp.indices = cidx
	}
	s := C.kvp_prefill(c.c, l, C.uint32_t(n), iptr(positions), fptr(q), fptr(k), fptr(v), fptr(out), selp)
	runtime.KeepAlive(c)
	if err := c.status(s); err != nil {
		return 0, false, err
	}
	if selp == nil {
		return 0, false, nil
	}
	got := int(selp.n)
	if got > len(indices) {
		got = len(indices)
	}
	copy(indices, unsafe.Slice((*int32)(unsafe.Pointer(cidx)), len(indices))[:got])
	return got, selp.selected != 0, nil
}

// Append stores tokens without attention (position-based pruning still applies).
func (c *Cache) Append(layer int, k, v []float32, positions []int32) error {
	return c.tokenCall(layer, false, func() (int, error) { return c.tokens(nil, false, k, v, nil, positions) },
		func(l, n C.uint32_t) C.kvp_status {
			return C.kvp_append(c.c, l, n, iptr(positions), fptr(k), fptr(v))
		})
}

// Half is the element type of the *Half calls' rows (kvp_io_dtype; the numbers are pinned).
type Half uint32

const (
	F16  Half = 1 // IEEE binary16 bits
	BF16 Half = 2 // bfloat16 bits (the high half of a float32)
)

func hptr(x []uint16) unsafe.Pointer {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Pointer(&x[0])
}

// halfTokens checks the lengths of 2-byte rows as tokens does for float rows.
func (c *Cache) halfTokens(q []uint16, checkQ bool, k, v, out []uint16, positions []int32) (int, error) {
	return c.rowTokens("elements", len(q), checkQ, len(k), len(v), len(out), out != nil, len(positions), positions != nil)
}

// DecodeHalf is Decode with 2-byte rows (kvp_decode_ex): q, k, v and out hold the bits of IEEE
// half (F16) or bfloat16 (BF16) values. The cache and outputs are those of Decode on the widened
// values, its outputs rounded to nearest even.
func (c *Cache) DecodeHalf(layer int, dtype Half, q, k, v, out []uint16) error {
	return c.tokenCall(layer, true, func() (int, error) {
		if out == nil {
			return 0, argErr("out is nil")
		}
		return c.halfTokens(q, true, k, v, out, nil)
	}, func(l, _ C.uint32_t) C.kvp_status {
		return C.kvp_decode_ex(c.c, l, C.kvp_io_dtype(dtype), hptr(q), hptr(k), hptr(v), hptr(out))
	})
}

// PrefillHalf is Prefill with 2-byte rows (kvp_prefill_ex; see DecodeHalf).
func (c *Cache) PrefillHalf(layer int, dtype Half, q, k, v []uint16, positions []int32, out []uint16) error {
	return c.tokenCall(layer, false, func() (int, error) { return c.halfTokens(q, true, k, v, out, positions) },
		func(l, n C.uint32_t) C.kvp_status {
			return C.kvp_prefill_ex(c.c, l, n, iptr(positions), C.kvp_io_dtype(dtype), hptr(q), hptr(k), hptr(v), hptr(out), nil)
		})
}

// AppendHalf is Append with 2-byte rows (kvp_append_ex; see DecodeHalf).
func (c *Cache) AppendHalf(layer int, dtype Half, k, v []uint16, positions []int32) error {
	return c.tokenCall(layer, false, func() (int, error) { return c.halfTokens(nil, false, k, v, nil, positions) },
		func(l, n C.uint32_t) C.kvp_status {
			return C.kvp_append_ex(c.c, l, n, iptr(positions), C.kvp_io_dtype(dtype), hptr(k), hptr(v))
		})
}

// LayerLen is the number of tokens layer keeps (max over KV heads); 0 for a bad layer or a closed cache.
func (c *Cache) LayerLen(layer int) int {
	if c.lock() != nil {
		return 0
	}
	defer c.mu.Unlock()
	l, err := u32("layer", layer)
	if err != nil {
		return 0
	}
	n := int(C.kvp_layer_len(c.c, l))
	runtime.KeepAlive(c)
	return n
}

// LayerPositions returns the original positions kept by (layer, kvHead), ascending.
func (c *Cache) LayerPositions(layer, kvHead int) ([]int32, error) {
	if err := c.lock(); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	l, err := u32("layer", layer)
	if err != nil {
		return nil, err
	}
	h, err := u32("kv head", kvHead)
	if err != nil {
		return nil, err
	}
	var n C.uint32_t
	s := C.kvp_layer_positions(c.c, l, h, nil, 0, &n)
	if s != C.KVP_OK && s != C.KVP_ERR_BUFFER {
		return nil, c.status(s)
	}
	out := make([]int32, int(n))
	if n == 0 {
		return out, nil
	}
	s = C.kvp_layer_positions(c.c, l, h, iptr(out), n, &n)
	runtime.KeepAlive(c)
	if err := c.status(s); err != nil {
		return nil, err
	}
	return out[:int(n)], nil
}

// Stats returns the cache's counters.
func (c *Cache) Stats() (Stats, error) {
	if err := c.lock(); err != nil {
		return Stats{}, err
	}
	defer c.mu.Unlock()
	var s C.kvp_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	st := C.kvp_get_stats(c.c, &s)
	runtime.KeepAlive(c)
	if err := c.status(st); err != nil {
		return Stats{}, err
	}
	return Stats{ArenaBytes: uint64(s.arena_bytes), LiveBytes: uint64(s.live_bytes),
		PeakLiveBytes: uint64(s.peak_live_bytes), TokensSeen: uint64(s.tokens_seen),
		PruneEvents: uint64(s.prune_events), TokensEvicted: uint64(s.tokens_evicted)}, nil
}

// LayerCapacity is the token slots of layer per KV head (kvp_layer_capacity); 0 for a layer the
// cache lacks or a closed cache.
func (c *Cache) LayerCapacity(layer int) int {
	if c.lock() != nil {
		return 0
	}
	defer c.mu.Unlock()
	l, err := u32("layer", layer)
	if err != nil {
		return 0
	}
	n := int(C.kvp_layer_capacity(c.c, l))
	runtime.KeepAlive(c)
	return n
}

// PrefillRoom is the largest prefill chunk that fits every layer from the current state
// (kvp_prefill_room): chunk a long prompt by it. 0 for a closed cache.
func (c *Cache) PrefillRoom() int {
	if c.lock() != nil {
		return 0
	}
	defer c.mu.Unlock()
	n := int(C.kvp_prefill_room(c.c))
	runtime.KeepAlive(c)
	return n
}

// LayerStats are the figures of one layer (kvp_layer_stats). Lazy (SimLayerKV): 1 lazy
// (trimmed to sinks + window), 0 not lazy, -1 undecided or another policy.
type LayerStats struct {
	Capacity, Len                         uint32
	LiveBytes, PruneEvents, TokensEvicted uint64
	EvictThreshold                        uint32
	Sparsity                              float32
	Lazy                                  int32
	PromptEarly                           uint32 // max_prompt: selections made before a prompt ended
}

// LayerStats returns kvp_get_layer_stats of layer.
func (c *Cache) LayerStats(layer int) (LayerStats, error) {
	if err := c.lock(); err != nil {
		return LayerStats{}, err
	}
	defer c.mu.Unlock()
	l, err := u32("layer", layer)
	if err != nil {
		return LayerStats{}, err
	}
	var s C.kvp_layer_stats
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	st := C.kvp_get_layer_stats(c.c, l, &s)
	runtime.KeepAlive(c)
	if err := c.status(st); err != nil {
		return LayerStats{}, err
	}
	return LayerStats{Capacity: uint32(s.capacity), Len: uint32(s.len), LiveBytes: uint64(s.live_bytes),
		PruneEvents: uint64(s.prune_events), TokensEvicted: uint64(s.tokens_evicted),
		EvictThreshold: uint32(s.evict_threshold), Sparsity: float32(s.sparsity), Lazy: int32(s.lazy),
		PromptEarly: uint32(s.prompt_early)}, nil
}

// Reset starts a new sequence in the same arena.
func (c *Cache) Reset() error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	s := C.kvp_reset(c.c)
	runtime.KeepAlive(c)
	return c.status(s)
}

// LastError is the message of the last failed library call on this cache.
func (c *Cache) LastError() string {
	if c.lock() != nil {
		return ""
	}
	defer c.mu.Unlock()
	m := C.GoString(C.kvp_last_error(c.c))
	runtime.KeepAlive(c)
	return m
}

// QueryStatsSet sets TriAttention's query statistics of (layer, qHead) for tri_stats=given
// (kvp_query_stats_set): mean is the mean of each pre-RoPE query channel (head_dim values),
// absMean the mean magnitude of each unit (RoPE pairs, then each unrotated channel).
func (c *Cache) QueryStatsSet(layer, qHead int, mean, absMean []float32) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	l, err := u32("layer", layer)
	if err != nil {
		return err
	}
	h, err := u32("qHead", qHead)
	if err != nil {
		return err
	}
	if len(mean) != int(c.model.HeadDim) || len(absMean) == 0 {
		return argErr("mean has %d values (head_dim %d), absMean %d", len(mean), c.model.HeadDim, len(absMean))
	}
	s := C.kvp_query_stats_set(c.c, l, h, fptr(mean), fptr(absMean), C.uint32_t(len(absMean)))
	runtime.KeepAlive(c)
	return c.status(s)
}

// PromptEnd ends the prompt (kvp_prompt_end; config max_prompt > 0): every layer holding an open
// prompt selects from the whole prompt now, as one prefill of it would. Without an open prompt
// nothing happens; with a draft open it is ErrState.
func (c *Cache) PromptEnd() error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	s := C.kvp_prompt_end(c.c)
	runtime.KeepAlive(c)
	return c.status(s)
}

// DraftBegin opens a draft (speculative decoding, kvp_draft_begin; needs max_draft > 0): until
// DraftCommit, Prefill and Decode only append draft tokens and attend.
func (c *Cache) DraftBegin() error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	s := C.kvp_draft_begin(c.c)
	runtime.KeepAlive(c)
	return c.status(s)
}

// DraftCommit keeps the first accepted draft tokens of every layer and drops the rest
// (kvp_draft_commit), leaving the cache as one prefill of exactly those tokens would have. No
// open draft is ErrState; more than a layer drafted is ErrArg (the draft stays open).
func (c *Cache) DraftCommit(accepted int) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	a, err := u32("accepted", accepted)
	if err != nil {
		return newError(ErrArg, "accepted=%d does not fit uint32", accepted)
	}
	s := C.kvp_draft_commit(c.c, a)
	runtime.KeepAlive(c)
	return c.status(s)
}

// ---- the host's parallel-for (issue 30; kvp_set_parallel) ----

// hostParallel is a function given to SetParallel, found by kvpGoParallel through its id (C
// holds the id as kvp_set_parallel's user pointer: no Go pointer goes to C).
type hostParallel struct {
	id       uintptr
	fn       func(n uint32, run func(t uint32))
	panicked *interface{} // a panic of fn in the current call, re-raised by Cache.status
}

var hostParallels = struct {
	sync.Mutex
	m    map[uintptr]*hostParallel
	next uintptr
}{m: map[uintptr]*hostParallel{}}

func registerParallel(fn func(n uint32, run func(t uint32))) *hostParallel {
	hostParallels.Lock()
	defer hostParallels.Unlock()
	hostParallels.next++
	p := &hostParallel{id: hostParallels.next, fn: fn}
	hostParallels.m[p.id] = p
	return p
}

// unregister removes p (nil: nothing) from the registry and returns nil.
func (p *hostParallel) unregister() *hostParallel {
	if p != nil {
		hostParallels.Lock()
		delete(hostParallels.m, p.id)
		hostParallels.Unlock()
	}
	return nil
}

// kvpGoParallel is the kvp_parallel_fn of every Go cache (through kvp_go_parallel): it calls the
// registered function with a run(t) that runs the library's task t at most once, then runs here
// whatever the function skipped and waits for any task still running, so the library's call
// always completes; a panic of the function is recovered (it must not unwind through C) and
// re-raised by the Cache method that made the call.
//
//export kvpGoParallel
func kvpGoParallel(id C.uintptr_t, n C.uint32_t, task, arg unsafe.Pointer) {
	hostParallels.Lock()
	p := hostParallels.m[uintptr(id)]
	hostParallels.Unlock()
	state := make([]uint32, int(n)) // per t: 0 not started, 1 running, 2 done
	runTask := func(t uint32) {
		C.kvp_go_run_task(task, arg, C.uint32_t(t))
		atomic.StoreUint32(&state[t], 2)
	}
	if p != nil {
		run := func(t uint32) {
			if t >= uint32(n) {
				panic(fmt.Sprintf("kvprune: parallel task %d of %d (t must be < n)", t, n))
			}
			if !atomic.CompareAndSwapUint32(&state[t], 0, 1) {
				panic(fmt.Sprintf("kvprune: parallel task %d of %d run twice, or after the function returned", t, n))
			}
			runTask(t)
		}
		func() {
			defer func() {
				if r := recover(); r != nil {
					p.panicked = &r
				}
			}()
			p.fn(uint32(n), run)
		}()
	}
	for t := range state {
		if atomic.CompareAndSwapUint32(&state[t], 0, 1) {
			runTask(uint32(t))
		}
		for atomic.LoadUint32(&state[t]) != 2 { // started by a goroutine the function did not wait for
			runtime.Gosched()
		}
	}
}

// SetParallel hands the cache's parallel work to the host's goroutines (kvp_set_parallel): from
// now on every call that would use k > 1 of the cache's `threads` calls p(k, run) on the calling
// goroutine instead of waking the cache's own workers. p must call run(t) once for each t in
// [0, k), on any goroutines, and return after all of them returned (e.g. go + sync.WaitGroup);
// outputs are bit-identical whichever goroutine runs which t. A t that p skips runs after p
// returns; run(t) with t >= k or a t that already ran panics. A panic of p (on the calling
// goroutine) continues in the Cache method that called it, after the library's call completed.
// p must not call methods of this cache. nil restores the default: the cache's own workers
// (thread_pool=own) or the caller alone (thread_pool=host, the configuration that starts no
// workers). With threads=1, p is never called. ErrUnsupported from a library built without
// threads.
func (c *Cache) SetParallel(p func(n uint32, run func(t uint32))) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	var s C.kvp_status
	var hp *hostParallel
	if p == nil {
		s = C.kvp_set_parallel(c.c, nil, nil)
	} else {
		hp = registerParallel(p)
		s = C.kvp_set_parallel(c.c, C.kvp_go_parallel_fn(), C.kvp_go_user(C.uintptr_t(hp.id)))
	}
	runtime.KeepAlive(c)
	if err := c.status(s); err != nil {
		hp.unregister() // not taken: the cache keeps what it had
		return err
	}
	c.par.unregister() // the one it replaced
	c.par = hp
	return nil
}

// StateSize is the bytes StateSave writes now (kvp_state_size); 0 for a closed cache.
func (c *Cache) StateSize() int {
	if c.lock() != nil {
		return 0
	}
	defer c.mu.Unlock()
	n := int(C.kvp_state_size(c.c))
	runtime.KeepAlive(c)
	return n
}

// StateSave writes the cache's state into buf (kvp_state_save; the library allocates nothing) and
// returns the bytes written: the state is buf[:n]. A too small buf is ErrBuffer with buf
// untouched; an open draft is ErrState. The cache is never changed.
func (c *Cache) StateSave(buf []byte) (int, error) {
	if err := c.lock(); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	var one [1]byte
	p := unsafe.Pointer(&one[0]) // an empty buf: a valid pointer with size 0 (ErrBuffer, not ErrArg)
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	var written C.size_t
	s := C.kvp_state_save(c.c, p, C.size_t(len(buf)), &written)
	runtime.KeepAlive(c)
	if err := c.status(s); err != nil {
		return 0, err
	}
	return int(written), nil
}

// StateLoad replaces the cache's state with one StateSave wrote from a cache of the same
// configuration (kvp_state_load). A truncated, corrupted or foreign state is an error and the
// cache is unchanged.
func (c *Cache) StateLoad(buf []byte) error {
	if err := c.lock(); err != nil {
		return err
	}
	defer c.mu.Unlock()
	var one [1]byte
	p := unsafe.Pointer(&one[0])
	if len(buf) > 0 {
		p = unsafe.Pointer(&buf[0])
	}
	s := C.kvp_state_load(c.c, p, C.size_t(len(buf)))
	runtime.KeepAlive(c)
	return c.status(s)
}

// ---- RoPE frequency tables (issue 21; kvprune.h kvp_rope_freqs_*) ----

func ropeTable(n uint32, f func(t *C.double, e *C.char) C.kvp_status) ([]float64, error) {
	if n == 0 {
		return nil, newError(ErrArg, "n (rope_dim/2 pairs) must be > 0")
	}
	t := make([]float64, n)
	buf := make([]byte, errLen)
	if s := f((*C.double)(unsafe.Pointer(&t[0])), (*C.char)(unsafe.Pointer(&buf[0]))); s != C.KVP_OK {
		return nil, errFromBuf(s, buf)
	}
	return t, nil
}

// RopeFreqsLinear is linear RoPE scaling (position interpolation): theta^(-i/n)/factor for the
// n = rope_dim/2 pairs.
func RopeFreqsLinear(n uint32, theta, factor float64) ([]float64, error) {
	return ropeTable(n, func(t *C.double, e *C.char) C.kvp_status {
		return C.kvp_rope_freqs_linear(t, C.uint32_t(n), C.double(theta), C.double(factor), e, errLen)
	})
}

// RopeFreqsLlama3 is Llama 3.1's RoPE frequency scaling (kvp_rope_freqs_llama3).
func RopeFreqsLlama3(n uint32, theta, factor, lowFreqFactor, highFreqFactor, originalMaxPos float64) ([]float64, error) {
	return ropeTable(n, func(t *C.double, e *C.char) C.kvp_status {
		return C.kvp_rope_freqs_llama3(t, C.uint32_t(n), C.double(theta), C.double(factor), C.double(lowFreqFactor),
			C.double(highFreqFactor), C.double(originalMaxPos), e, errLen)
	})
}

// RopeFreqsYarn is YaRN (kvp_rope_freqs_yarn): the frequencies and the attention factor (set it
// as the config key rope_attn_factor). The published defaults are betaFast 32, betaSlow 1.
func RopeFreqsYarn(n uint32, theta, factor, originalMaxPos, betaFast, betaSlow float64) ([]float64, float32, error) {
	var a C.float
	t, err := ropeTable(n, func(t *C.double, e *C.char) C.kvp_status {
		return C.kvp_rope_freqs_yarn(t, C.uint32_t(n), C.double(theta), C.double(factor), C.double(originalMaxPos),
			C.double(betaFast), C.double(betaSlow), &a, e, errLen)
	})
	return t, float32(a), err
}

// RopeFreqsDivided is theta^(-i/n)/divisors[i] (a GGUF rope_freqs tensor, LongRoPE factors);
// n = len(divisors).
func RopeFreqsDivided(theta float64, divisors []float32) ([]float64, error) {
	if len(divisors) > math.MaxUint32 {
		return nil, newError(ErrArg, "more than 2^32-1 divisors")
	}
	n := uint32(len(divisors))
	return ropeTable(n, func(t *C.double, e *C.char) C.kvp_status {
		return C.kvp_rope_freqs_divided(t, C.uint32_t(n), C.double(theta), (*C.float)(unsafe.Pointer(&divisors[0])), e, errLen)
	})
}

//! Issue 30 through the Rust binding: the host's parallel-for (`thread_pool=host`,
//! `kvp_set_parallel`) gives the bits of one thread, is called, and can be cleared.
use kvprune::{ffi, Cache, Config, Model, Status};
use std::os::raw::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

mod common;
use common::Rng;

const LAYERS: u32 = 2;
const NQ: usize = 4;
const NKV: usize = 2;
const HD: usize = 32;
const PROMPT: usize = 24;
const DECODES: usize = 4;

fn model() -> Model {
    Model::new(LAYERS, NQ as u32, NKV as u32, HD as u32)
}

/// KVP_PAR_WORK=0 (read at create): every call with 2+ threads goes parallel, however small.
/// Set once, before any cache of this test binary exists (no getenv runs beside the setenv).
fn force_parallel() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("KVP_PAR_WORK", "0"));
}

fn cache(spec: &str) -> Cache<'static> {
    force_parallel();
    Cache::new(&Config::from_spec(&model(), &format!("policy=full capacity=64 {}", spec)).unwrap()).unwrap()
}

/// Output bits of a prefill of PROMPT tokens and DECODES decode steps in every layer, then the
/// kept positions.
fn run(c: &mut Cache) -> Vec<u32> {
    let mut r = Rng(0x3000_0030);
    let (q, k, v) = (r.vec(PROMPT * NQ * HD), r.vec(PROMPT * NKV * HD), r.vec(PROMPT * NKV * HD));
    let mut bits = Vec::new();
    let mut out = vec![0f32; PROMPT * NQ * HD];
    for layer in 0..LAYERS {
        c.prefill(layer, &q, &k, &v, None, Some(&mut out)).unwrap();
        bits.extend(out.iter().map(|x| x.to_bits()));
    }
    for _ in 0..DECODES {
        for layer in 0..LAYERS {
            let (q, k, v) = (r.vec(NQ * HD), r.vec(NKV * HD), r.vec(NKV * HD));
            let mut out = vec![0f32; NQ * HD];
            c.decode(layer, &q, &k, &v, &mut out).unwrap();
            bits.extend(out.iter().map(|x| x.to_bits()));
        }
    }
    for layer in 0..LAYERS {
        for h in 0..NKV as u32 {
            bits.extend(c.layer_positions(layer, h).unwrap().iter().map(|&p| p as u32));
        }
    }
    bits
}

fn one_thread() -> Vec<u32> {
    run(&mut cache("threads=1"))
}

#[test]
fn thread_pool_key_reaches_the_struct() {
    let cfg = Config::from_spec(&model(), "thread_pool=host").unwrap();
    assert_eq!(cfg.raw().thread_pool, ffi::KVP_THREAD_POOL_HOST);
    assert_eq!(cfg.get("thread_pool").unwrap(), 1.0);
    assert_eq!(Config::new(&model()).unwrap().raw().thread_pool, ffi::KVP_THREAD_POOL_OWN);
    assert_eq!(Config::from_spec(&model(), "thread_pool=theirs").unwrap_err().status, Status::Config);
}

#[test]
fn host_threads_give_the_bits_of_one_thread() {
    let want = one_thread();
    // t 1..n on scoped threads of their own, t 0 on the caller
    let calls = Arc::new(AtomicUsize::new(0));
    let mut c = cache("threads=3 thread_pool=host");
    let counted = calls.clone();
    c.set_parallel_fn(move |n, run| {
        assert!((2..=3).contains(&n), "n = {}", n);
        counted.fetch_add(1, Ordering::Relaxed);
        std::thread::scope(|s| {
            for t in 1..n {
                s.spawn(move || run(t));
            }
            run(0);
        });
    })
    .unwrap();
    assert_eq!(run(&mut c), want);
    assert!(calls.load(Ordering::Relaxed) > 0, "the host's parallel-for was never called");

    // one after another on the caller, the last t first; on a thread_pool=own cache too
    for spec in ["threads=3 thread_pool=host", "threads=3"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut c = cache(spec);
        let counted = calls.clone();
        c.set_parallel_fn(move |n, run| {
            counted.fetch_add(1, Ordering::Relaxed);
            for t in (0..n).rev() {
                run(t);
            }
        })
        .unwrap();
        assert_eq!(run(&mut c), want, "{}", spec);
        assert!(calls.load(Ordering::Relaxed) > 0, "{}: never called", spec);
    }
}

/// A raw `kvp_parallel_fn`: counts its calls in `*user` (an AtomicUsize), runs the tasks in a row.
unsafe extern "C" fn counting_serial(user: *mut c_void, n: u32, task: ffi::kvp_parallel_task, arg: *mut c_void) {
    (*(user as *const AtomicUsize)).fetch_add(1, Ordering::Relaxed);
    for t in 0..n {
        task(arg, t);
    }
}

#[test]
fn raw_set_parallel_and_clear_restore_the_default() {
    let want = one_thread();
    let calls = Box::new(AtomicUsize::new(0));
    let user = &*calls as *const AtomicUsize as *mut c_void;
    let mut c = cache("threads=3 thread_pool=host");
    unsafe { c.set_parallel(Some(counting_serial), user) }.unwrap();
    assert_eq!(run(&mut c), want);
    let n = calls.load(Ordering::Relaxed);
    assert!(n > 0);
    // None: the caller alone again (thread_pool=host), same bits, no more calls
    unsafe { c.set_parallel(None, ptr::null_mut()) }.unwrap();
    c.reset().unwrap();
    assert_eq!(run(&mut c), want);
    assert_eq!(calls.load(Ordering::Relaxed), n);
    // kept across reset; clear_parallel gives an own pool its workers back
    let mut own = cache("threads=3");
    unsafe { own.set_parallel(Some(counting_serial), user) }.unwrap();
    own.reset().unwrap();
    assert_eq!(run(&mut own), want);
    let n2 = calls.load(Ordering::Relaxed);
    assert!(n2 > n);
    own.clear_parallel().unwrap();
    own.reset().unwrap();
    assert_eq!(run(&mut own), want);
    assert_eq!(calls.load(Ordering::Relaxed), n2);
    // a closure replaces a raw function, and the other way round
    own.set_parallel_fn(|n, run| (0..n).for_each(|t| run(t))).unwrap();
    unsafe { own.set_parallel(Some(counting_serial), user) }.unwrap();
    own.reset().unwrap();
    assert_eq!(run(&mut own), want);
    assert!(calls.load(Ordering::Relaxed) > n2);
    drop(own);
    drop(c);
    // threads=1 never calls it
    let mut single = cache("threads=1 thread_pool=host");
    single.set_parallel_fn(|_, _| panic!("called with threads=1")).unwrap();
    assert_eq!(run(&mut single), want);
    // NULL handle: KVP_ERR_ARG (a Cache always holds a live handle, so through ffi)
    assert_eq!(unsafe { ffi::kvp_set_parallel(ptr::null_mut(), Some(counting_serial), user) }, ffi::KVP_ERR_ARG);
    assert_eq!(unsafe { ffi::kvp_set_parallel(ptr::null_mut(), None, ptr::null_mut()) }, ffi::KVP_ERR_ARG);
}

#[test]
fn a_skipping_or_panicking_host_still_completes_the_call() {
    let want = one_thread();
    // runs none of the tasks: the binding runs them after it returns
    let mut c = cache("threads=3 thread_pool=host");
    c.set_parallel_fn(|_, _| {}).unwrap();
    assert_eq!(run(&mut c), want);
    // runs t 0 twice: the second run(0) panics (not run), the panic surfaces in the cache call
    c.set_parallel_fn(|n, run| {
        for t in 0..n {
            run(t);
        }
        run(0);
    })
    .unwrap();
    c.reset().unwrap();
    let r = panic::catch_unwind(AssertUnwindSafe(|| run(&mut c)));
    let msg = r.unwrap_err();
    let msg = msg.downcast_ref::<String>().map(String::as_str).unwrap_or("");
    assert!(msg.contains("run twice"), "{}", msg);
    // the cache is whole: the same run from a reset gives the same bits
    c.set_parallel_fn(|n, run| (0..n).for_each(|t| run(t))).unwrap();
    c.reset().unwrap();
    assert_eq!(run(&mut c), want);
}

//! Links the static libkvprune.a (standard library only, no build dependencies).
//!
//! Where the library is looked for, first match wins:
//!   1. `KVPRUNE_LIB_DIR=<dir with libkvprune.a>`: links `-lkvprune` from there plus the C++
//!      runtime, libm and pthread (the defaults of a build with worker threads). Override that
//!      list with `KVPRUNE_EXTRA_LIBS="stdc++ m"` (space-separated library names; empty string =
//!      none), e.g. for a build with -DKVP_THREADS=OFF.
//!   2. `pkg-config --static --libs kvprune` (set `PKG_CONFIG_PATH=<prefix>/lib/pkgconfig` for
//!      a non-system install); `PKG_CONFIG` names another pkg-config binary.
use std::env;
use std::process::Command;

fn emit_lib(name: &str) {
    if name == "kvprune" {
        println!("cargo:rustc-link-lib=static=kvprune");
    } else {
        println!("cargo:rustc-link-lib={}", name);
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for v in ["KVPRUNE_LIB_DIR", "KVPRUNE_EXTRA_LIBS", "PKG_CONFIG_PATH", "PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={}", v);
    }

    if let Ok(dir) = env::var("KVPRUNE_LIB_DIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-search=native={}", dir);
            println!("cargo:rerun-if-changed={}/libkvprune.a", dir);
            emit_lib("kvprune");
            let extra = env::var("KVPRUNE_EXTRA_LIBS").unwrap_or_else(|_| "stdc++ m pthread".to_string());
            for lib in extra.split_whitespace() {
                emit_lib(lib);
            }
            return;
        }
    }

    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&pkg_config).args(["--static", "--libs", "kvprune"]).output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!(
            "`{} --static --libs kvprune` failed: {}\nInstall kvprune (cmake --install) and set \
             PKG_CONFIG_PATH=<prefix>/lib/pkgconfig, or set KVPRUNE_LIB_DIR=<dir with libkvprune.a>.",
            pkg_config,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run `{}` ({}); set KVPRUNE_LIB_DIR=<dir with libkvprune.a> instead",
            pkg_config, e
        ),
    };
    let flags = String::from_utf8_lossy(&out.stdout).to_string();
    let mut seen_kvprune = false;
    for tok in flags.split_whitespace() {
        if let Some(dir) = tok.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={}", dir);
            println!("cargo:rerun-if-changed={}/libkvprune.a", dir);
        } else if let Some(lib) = tok.strip_prefix("-l") {
            seen_kvprune |= lib == "kvprune";
            emit_lib(lib);
        } else if tok == "-fopenmp" {
            emit_lib("gomp");
        } else if tok == "-pthread" {
            emit_lib("pthread");
        } else {
            // Anything else (-Wl,..., -framework ...) goes to the linker as it is.
            println!("cargo:rustc-link-arg={}", tok);
        }
    }
    if !seen_kvprune {
        emit_lib("kvprune");
    }
}

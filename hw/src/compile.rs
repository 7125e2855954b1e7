//! NVRTC compilation of the embedded kernel modules for the device's own architecture
//! (`sm_90` on an H200), with an on-disk cache keyed by a hash of the expanded source, the
//! options, the NVRTC version and the architecture (DeepEP V2's JIT does the same). Cache files
//! are written to a temporary name and renamed, so concurrent runs never read half a file.

use eptwin_engine::api::{InputKind, read_input};
use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys as nvrtc;
use eptwin_kernels::{KernelModule, ModuleId};
use sha2::{Digest, Sha256};

use crate::cuda::guarded;
use crate::error::HwError;
use crate::exec::Devices;

/// NVRTC is loadable; its version.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { nvrtc::is_culib_present() } {
        return Err("NVRTC is not installed here (libnvrtc.so could not be loaded)".into());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let r = guarded("loading NVRTC", || unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) })?;
    if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {r:?}"));
    }
    Ok((major, minor))
}

/// A cached kernel binary: a compiled module is a few MiB at most.
const CUBIN: InputKind = InputKind {
    noun: "a cached cubin",
    format: "a CUDA binary",
    max_bytes: 64 << 20,
    max_text: "64 MiB",
};

pub struct Compiler {
    pub version: (i32, i32),
    pub cache_dir: Option<PathBuf>,
    /// (cache hits, compilations) — reported in measurements.
    pub stats: std::cell::Cell<(u32, u32)>,
}

/// The compile options for `arch` = (major, minor) and the module's defines (sorted, so the
/// cache key does not depend on the caller's order).
pub fn options(arch: (i32, i32), defines: &[(&str, String)]) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
        "-std=c++17".to_string(),
        "--extra-device-vectorization".to_string(),
    ];
    let mut defs: Vec<String> = defines.iter().map(|(k, v)| format!("-D{k}={v}")).collect();
    defs.sort();
    opts.extend(defs);
    opts
}

/// The cache key: sha256 over source, options, NVRTC version and architecture.
pub fn cache_key(source: &str, opts: &[String], version: (i32, i32), arch: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in opts {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("\0nvrtc {}.{}\0sm_{}{}", version.0, version.1, arch.0, arch.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Compiler {
    pub fn new(version: (i32, i32), cache_dir: Option<PathBuf>) -> Self {
        Compiler { version, cache_dir, stats: std::cell::Cell::new((0, 0)) }
    }

    /// A cubin for `module` on `arch`, from the cache or freshly compiled.
    pub fn cubin(
        &self,
        module: &KernelModule,
        arch: (i32, i32),
        defines: &[(&str, String)],
    ) -> Result<Vec<u8>, HwError> {
        let source = module.expanded_source().map_err(|e| HwError::Compile {
            file: module.file.to_string(),
            options: String::new(),
            log: e.to_string(),
        })?;
        let opts = options(arch, defines);
        let key = cache_key(&source, &opts, self.version, arch);
        let cached =
            self.cache_dir.as_ref().map(|d| d.join(format!("{}-{key}.cubin", module.file)));
        // The cache directory is the user's (`EPTWIN_KERNEL_CACHE`): only a regular file of a
        // cubin's size is read, so a FIFO or a device there cannot hang or flood the run.
        if let Some(path) = &cached
            && let Ok(bytes) = read_input(path, &CUBIN)
        {
            let (hits, compiles) = self.stats.get();
            self.stats.set((hits + 1, compiles));
            return Ok(bytes);
        }
        let cubin = compile(module.file, &source, &opts)?;
        let (hits, compiles) = self.stats.get();
        self.stats.set((hits, compiles + 1));
        if let Some(path) = &cached {
            // A cache that cannot be written only costs a recompilation next time.
            if let Err(e) = write_atomic(path, &cubin) {
                tracing::warn!("kernel cache not written: {e}");
            }
        }
        Ok(cubin)
    }
}

impl Compiler {
    /// Compile module `id` with `defines` for every device of `devs` and load it there under
    /// `name` (replacing a module loaded under that name before).
    pub fn load(
        &self,
        devs: &mut Devices,
        id: ModuleId,
        name: &'static str,
        defines: &[(&str, String)],
    ) -> Result<(), HwError> {
        let module = eptwin_kernels::module(id);
        for dev in &mut devs.list {
            let cubin = self.cubin(module, dev.gpu.compute_capability, defines)?;
            let loaded = dev.gpu.load_module(&cubin, module.entry_points)?;
            dev.modules.insert(name, loaded);
        }
        Ok(())
    }

    /// `"H cached, C compiled"`: where this run's kernels came from.
    pub fn describe_stats(&self) -> String {
        let (hits, compiles) = self.stats.get();
        format!("{hits} cached, {compiles} compiled")
    }
}

/// Write a cache file the way results are written (`eptwin_engine::api::write_file_atomic`),
/// so concurrent runs never read half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), HwError> {
    eptwin_engine::api::write_file_atomic(path, bytes)
        .map_err(|e| HwError::Cache { path: path.display().to_string(), message: e.to_string() })
}

/// Compile one expanded source to a cubin with NVRTC.
pub fn compile(file: &str, source: &str, opts: &[String]) -> Result<Vec<u8>, HwError> {
    let fail =
        |log: String| HwError::Compile { file: file.to_string(), options: opts.join(" "), log };
    let src = CString::new(source).map_err(|_| fail("source contains a NUL byte".into()))?;
    let name = CString::new(file).map_err(|_| fail("file name contains a NUL byte".into()))?;
    let c_opts: Vec<CString> =
        opts.iter().map(|o| CString::new(o.as_str()).expect("options have no NUL")).collect();
    let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    let run = || -> Result<Vec<u8>, HwError> {
        // SAFETY: valid NUL-terminated strings; no headers (they are inlined).
        let r = unsafe {
            nvrtc::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        check(r, "nvrtcCreateProgram").map_err(fail)?;
        // SAFETY: prog was created; options outlive the call.
        let r =
            unsafe { nvrtc::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
        if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail(program_log(prog)));
        }
        let mut size = 0usize;
        // SAFETY: compiled program.
        check(unsafe { nvrtc::nvrtcGetCUBINSize(prog, &mut size) }, "nvrtcGetCUBINSize")
            .map_err(fail)?;
        let mut cubin = vec![0u8; size];
        // SAFETY: buffer of the reported size.
        check(
            unsafe { nvrtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) },
            "nvrtcGetCUBIN",
        )
        .map_err(fail)?;
        Ok(cubin)
    };
    let out = guarded("NVRTC", run).map_err(fail)?;
    if !prog.is_null() {
        // SAFETY: created above.
        unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    }
    out
}

fn check(r: nvrtc::nvrtcResult, call: &str) -> Result<(), String> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        // SAFETY: returns a static string.
        let text = unsafe { CStr::from_ptr(nvrtc::nvrtcGetErrorString(r)) };
        Err(format!("{call}: {}", text.to_string_lossy()))
    }
}

fn program_log(prog: nvrtc::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: valid program.
    if unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut size) }
        != nvrtc::nvrtcResult::NVRTC_SUCCESS
    {
        return "(no log)".into();
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: buffer of the reported size.
    unsafe { nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) };
    String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_key_depends_on_every_input() {
        let o1 = options((9, 0), &[("NUM_RANKS", "8".into()), ("A", "1".into())]);
        let o2 = options((9, 0), &[("A", "1".into()), ("NUM_RANKS", "8".into())]);
        assert_eq!(o1, o2, "defines are sorted");
        let k = cache_key("src", &o1, (13, 0), (9, 0));
        assert_eq!(k, cache_key("src", &o1, (13, 0), (9, 0)));
        assert_ne!(k, cache_key("src2", &o1, (13, 0), (9, 0)));
        assert_ne!(k, cache_key("src", &o1, (13, 1), (9, 0)));
        assert_ne!(k, cache_key("src", &o1, (13, 0), (10, 0)));
        let o3 = options((9, 0), &[("NUM_RANKS", "4".into())]);
        assert_ne!(k, cache_key("src", &o3, (13, 0), (9, 0)));
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = std::env::temp_dir().join(format!("eptwin-cache-test-{}", std::process::id()));
        let path = dir.join("x.cubin");
        write_atomic(&path, b"abc").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        let names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Every module compiles for sm_90 with the NVRTC installed beside the GPU.
    #[test]
    #[ignore = "needs NVRTC: run with --include-ignored on the GPU machine (scripts/h200-measure.sh)"]
    fn every_kernel_compiles_for_sm_90() {
        let version = nvrtc_version().unwrap_or_else(|reason| panic!("{reason}"));
        let c = Compiler::new(version, None);
        for m in eptwin_kernels::MODULES {
            for defines in crate::kernel_defines::representative(m.id) {
                let cubin = c.cubin(m, (9, 0), &defines).unwrap_or_else(|e| panic!("{e}"));
                assert!(cubin.len() > 64, "{}: empty cubin", m.file);
            }
        }
    }
}

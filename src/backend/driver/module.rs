//! JIT-loaded modules, their entry functions, and kernel launches.
//!
//! # Loading beside a lane
//!
//! Since CUDA 12.2 the driver loads modules lazily by default
//! (`CUDA_MODULE_LOADING=LAZY`): `cuModuleLoadData` defers each kernel's code until
//! the function is asked for or first used, and NVIDIA's programming guide warns that
//! such a load may need the context to synchronize, so a program in which one kernel
//! waits for another (a persistent kernel) can deadlock. A lane (`backend::lane`) is
//! such a kernel: it runs until the host stops it. Seen on the H200 (driver 580,
//! CUDA 13, lazy by default): the two GPU tests that compile a program while a lane
//! runs hung until an outer timeout killed them, where allocating, freeing (deferred,
//! `resident`), pinning, eager launches of kernels loaded earlier and graph replays
//! beside a lane all finished. So [`LoadedModule::load_entries`]
//! (every module load of the crate) refuses while a resident kernel runs in the
//! current context under lazy loading, and finishes every entry's loading
//! (`cuFuncLoad`, where the driver has it) before it returns, so no load is left for
//! a first launch made later beside a lane.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::sys;

use super::stream::Stream;
use super::{check, count, DriverError, DriverResult};

/// A loaded module, unloaded when the last [`LoadedModule`] of its entries drops.
struct ModuleHandle(sys::CUmodule);

// SAFETY: a module handle is usable from any thread of the process; it is only
// read after loading and unloaded once, by the last owner's drop.
unsafe impl Send for ModuleHandle {}
// SAFETY: as above: shared owners only read the handle.
unsafe impl Sync for ModuleHandle {}

impl Drop for ModuleHandle {
    fn drop(&mut self) {
        // The module was loaded by `LoadedModule::load_entries` and this is the last
        // owner (the `Arc` in every `LoadedModule` of it is gone); deferred while a
        // resident kernel runs (`resident`).
        super::resident::release(super::resident::Release::Module(self.0));
    }
}

/// One entry function of a loaded module. Every entry of a module keeps the module
/// loaded (a shared `Arc`), so the kernels of one [`LoadedModule::load_entries`]
/// call can be used and dropped independently.
pub struct LoadedModule {
    module: Arc<ModuleHandle>,
    pub(in crate::backend) function: sys::CUfunction,
    /// Address and size of a module-scope global, when requested and present.
    pub(in crate::backend) global: Option<(u64, usize)>,
    /// Bytes of dynamic shared memory every launch of the function passes (0 until
    /// [`LoadedModule::use_dynamic_shared`] opts it in).
    pub(in crate::backend) dynamic_shared_bytes: u32,
}

// SAFETY: module and function handles are usable from any thread of the process.
unsafe impl Send for LoadedModule {}
// SAFETY: launches only read the handles.
unsafe impl Sync for LoadedModule {}

/// `text` as a C string for a driver call; a NUL byte inside is `CUDA_ERROR_NOT_FOUND`
/// (`INVALID_IMAGE` for the image itself) naming `call`.
fn c_string(text: &str, code: sys::CUresult, call: &'static str) -> DriverResult<CString> {
    CString::new(text).map_err(|_| DriverError { code, call })
}

impl LoadedModule {
    /// JIT-load PTX text and look up `entry` (and `global`, if given).
    pub fn load(ptx: &str, entry: &str, global: Option<&str>) -> DriverResult<LoadedModule> {
        let mut entries = Self::load_entries(ptx, &[(entry, global)])?;
        entries.pop().ok_or(DriverError {
            code: sys::CUresult::CUDA_ERROR_NOT_FOUND,
            call: "cuModuleGetFunction",
        })
    }

    /// JIT-load PTX text once (one `cuModuleLoadData`) and look up each entry
    /// function (with its module-scope global, if given), in order: a module of
    /// several kernels ([`crate::codegen::PtxModuleBuilder`]) costs one driver JIT.
    ///
    /// Refused ([`DriverError::module_load_refused_beside_a_lane`]) while a resident
    /// kernel runs in the current context under lazy module loading (module docs).
    pub fn load_entries(
        ptx: &str,
        entries: &[(&str, Option<&str>)],
    ) -> DriverResult<Vec<LoadedModule>> {
        if super::resident::running_in_current_context() && lazy_module_loading() {
            return Err(DriverError::module_load_refused_beside_a_lane());
        }
        let image = c_string(
            ptx,
            sys::CUresult::CUDA_ERROR_INVALID_IMAGE,
            "cuModuleLoadData (PTX contains a NUL byte)",
        )?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: image is a NUL-terminated PTX string that outlives the call.
        check(
            unsafe { sys::cuModuleLoadData(&mut raw, image.as_ptr() as *const c_void) },
            "cuModuleLoadData",
        )?;
        let module = Arc::new(ModuleHandle(raw));
        let mut loaded = Vec::with_capacity(entries.len());
        for &(entry, global) in entries {
            let entry = c_string(
                entry,
                sys::CUresult::CUDA_ERROR_NOT_FOUND,
                "cuModuleGetFunction (name contains a NUL byte)",
            )?;
            let mut function = std::ptr::null_mut();
            // SAFETY: live module (held by `module`); writes one function handle.
            check(
                unsafe { sys::cuModuleGetFunction(&mut function, raw, entry.as_ptr()) },
                "cuModuleGetFunction",
            )?;
            finish_loading(function)?;
            let global = match global {
                None => None,
                Some(name) => {
                    let name = c_string(
                        name,
                        sys::CUresult::CUDA_ERROR_NOT_FOUND,
                        "cuModuleGetGlobal (name contains a NUL byte)",
                    )?;
                    let (mut ptr, mut size) = (0u64, 0usize);
                    // SAFETY: live module; writes one pointer and one size.
                    check(
                        unsafe {
                            sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, raw, name.as_ptr())
                        },
                        "cuModuleGetGlobal_v2",
                    )?;
                    Some((ptr, size))
                }
            };
            loaded.push(LoadedModule {
                module: Arc::clone(&module),
                function,
                global,
                dynamic_shared_bytes: 0,
            });
        }
        Ok(loaded)
    }

    /// Whether `self` and `other` are entries of one loaded module.
    pub fn shares_module_with(&self, other: &LoadedModule) -> bool {
        Arc::ptr_eq(&self.module, &other.module)
    }

    /// Opt the function in to `bytes` of dynamic shared memory
    /// (`cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`, needed
    /// past 48 KiB) and make every later launch of it ([`launch`], a graph's kernel
    /// node) pass that many bytes. Once per function, right after loading; 0 does
    /// nothing. A size over the device's opt-in limit is the driver's
    /// `CUDA_ERROR_INVALID_VALUE` (the validator refuses such programs first).
    pub fn use_dynamic_shared(&mut self, bytes: u32) -> DriverResult<()> {
        if bytes == 0 {
            return Ok(());
        }
        let value = i32::try_from(bytes).map_err(|_| DriverError {
            code: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            call: "cuFuncSetAttribute (dynamic shared memory past i32::MAX)",
        })?;
        // SAFETY: live function handle of a loaded module (held by `self.module`);
        // the call sets one attribute of it and reads nothing else.
        check(
            unsafe {
                sys::cuFuncSetAttribute(
                    self.function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    value,
                )
            },
            "cuFuncSetAttribute",
        )?;
        self.dynamic_shared_bytes = bytes;
        Ok(())
    }

    /// Most co-resident blocks per SM for a block size and dynamic shared memory.
    pub fn max_active_blocks_per_sm(
        &self,
        block_threads: u32,
        dynamic_shared: usize,
    ) -> DriverResult<u32> {
        let mut n = 0;
        // SAFETY: live function handle; writes one int.
        check(
            unsafe {
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut n,
                    self.function,
                    block_threads as i32,
                    dynamic_shared,
                )
            },
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        Ok(n.max(0) as u32)
    }
}

/// Whether the driver loads modules lazily (`cuModuleGetLoadingMode`; the
/// `CUDA_MODULE_LOADING` environment variable, read once at `cuInit`, decides it). A
/// driver without the call (older than lazy loading) loads eagerly; a failing query
/// answers `true`, the answer that refuses a load rather than risk a hang. Cached once
/// known (it cannot change after `cuInit`).
pub fn lazy_module_loading() -> bool {
    static LAZY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if let Some(&lazy) = LAZY.get() {
        return lazy;
    }
    if !super::has_symbol("cuModuleGetLoadingMode") {
        return *LAZY.get_or_init(|| false);
    }
    let mut mode = sys::CUmoduleLoadingMode::CU_MODULE_EAGER_LOADING;
    // SAFETY: the symbol exists (checked above); writes one enum value.
    let status = unsafe { sys::cuModuleGetLoadingMode(&mut mode) };
    if status != sys::CUresult::CUDA_SUCCESS {
        return true;
    }
    *LAZY.get_or_init(|| mode == sys::CUmoduleLoadingMode::CU_MODULE_LAZY_LOADING)
}

/// Finish loading `function` now (`cuFuncLoad`; a no-op for a loaded function) so
/// that its first launch loads nothing. Skipped on drivers without the call (before
/// CUDA 12.4), whose `cuModuleGetFunction` loads the function itself.
fn finish_loading(function: sys::CUfunction) -> DriverResult<()> {
    static PRESENT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*PRESENT.get_or_init(|| super::has_symbol("cuFuncLoad")) {
        return Ok(());
    }
    // SAFETY: the symbol exists (checked above); `function` is a live handle just
    // returned by cuModuleGetFunction for a module that stays loaded.
    check(unsafe { sys::cuFuncLoad(function) }, "cuFuncLoad")
}

/// Enqueue a launch with a prebuilt parameter array, passing the function's
/// dynamic shared memory ([`LoadedModule::use_dynamic_shared`]).
///
/// # Safety
/// `params` must hold one pointer per kernel parameter, in order, each pointing at
/// a value of the parameter's size that stays alive for this call; every device
/// address passed must be live until the stream passes the launch.
#[inline]
pub unsafe fn launch(
    module: &LoadedModule,
    grid: [u32; 3],
    block: [u32; 3],
    stream: &Stream,
    params: &mut [*mut c_void],
    cooperative: bool,
) -> DriverResult<()> {
    count(|c| c.launches += 1);
    if cooperative {
        check(
            sys::cuLaunchCooperativeKernel(
                module.function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                module.dynamic_shared_bytes,
                stream.raw,
                params.as_mut_ptr(),
            ),
            "cuLaunchCooperativeKernel",
        )
    } else {
        check(
            sys::cuLaunchKernel(
                module.function,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                module.dynamic_shared_bytes,
                stream.raw,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )
    }
}

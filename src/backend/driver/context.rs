//! Devices, primary contexts and peer access.

use std::ffi::CStr;

use cudarc::driver::sys;

use super::{check, DriverResult};

/// A device ordinal resolved to a driver handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device(pub(in crate::backend) sys::CUdevice);

impl Device {
    /// `cuDeviceGet`.
    pub fn get(ordinal: i32) -> DriverResult<Device> {
        let mut d = 0;
        // SAFETY: writes one device handle; the driver validates the ordinal.
        check(unsafe { sys::cuDeviceGet(&mut d, ordinal) }, "cuDeviceGet")?;
        Ok(Device(d))
    }

    /// One integer attribute.
    pub fn attribute(self, attribute: Attribute) -> DriverResult<i32> {
        let mut v = 0;
        // SAFETY: writes one int for a valid device handle.
        check(
            unsafe { sys::cuDeviceGetAttribute(&mut v, attribute.raw(), self.0) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    /// Whether the device has stream-ordered memory pools (graph allocations).
    pub fn memory_pools_supported(self) -> DriverResult<bool> {
        Ok(self.attribute(Attribute::MemoryPoolsSupported)? != 0)
    }

    /// Marketing name.
    pub fn name(self) -> DriverResult<String> {
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the driver writes at most len bytes, NUL-terminated.
        check(
            unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, self.0) },
            "cuDeviceGetName",
        )?;
        // SAFETY: the buffer is NUL-terminated by the driver (and zero-initialised).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// Total memory in bytes.
    pub fn total_memory(self) -> DriverResult<u64> {
        let mut v = 0usize;
        // SAFETY: writes one size_t.
        check(
            unsafe { sys::cuDeviceTotalMem_v2(&mut v, self.0) },
            "cuDeviceTotalMem_v2",
        )?;
        Ok(v as u64)
    }
}

/// The device attributes the backend reads (`cuDeviceGetAttribute`), named without
/// the driver's types so `caps` can read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attribute {
    ComputeCapabilityMajor,
    ComputeCapabilityMinor,
    MultiprocessorCount,
    MaxThreadsPerBlock,
    MaxThreadsPerMultiprocessor,
    /// Largest block size on axis 0, 1 or 2.
    MaxBlockDim(usize),
    /// Largest grid size on axis 0, 1 or 2.
    MaxGridDim(usize),
    MaxSharedMemoryPerBlock,
    MaxSharedMemoryPerBlockOptin,
    WarpSize,
    CooperativeLaunch,
    ConcurrentKernels,
    AsyncEngineCount,
    MemoryPoolsSupported,
}

impl Attribute {
    fn raw(self) -> sys::CUdevice_attribute {
        use sys::CUdevice_attribute::*;
        match self {
            Attribute::ComputeCapabilityMajor => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            Attribute::ComputeCapabilityMinor => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            Attribute::MultiprocessorCount => CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            Attribute::MaxThreadsPerBlock => CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            Attribute::MaxThreadsPerMultiprocessor => {
                CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
            }
            Attribute::MaxBlockDim(0) => CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
            Attribute::MaxBlockDim(1) => CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
            Attribute::MaxBlockDim(_) => CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
            Attribute::MaxGridDim(0) => CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
            Attribute::MaxGridDim(1) => CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
            Attribute::MaxGridDim(_) => CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
            Attribute::MaxSharedMemoryPerBlock => CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            Attribute::MaxSharedMemoryPerBlockOptin => {
                CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            }
            Attribute::WarpSize => CU_DEVICE_ATTRIBUTE_WARP_SIZE,
            Attribute::CooperativeLaunch => CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            Attribute::ConcurrentKernels => CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS,
            Attribute::AsyncEngineCount => CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT,
            Attribute::MemoryPoolsSupported => CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        }
    }
}

/// A retained primary context. Released on drop.
pub struct PrimaryContext {
    pub(in crate::backend) raw: sys::CUcontext,
    device: Device,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is
// thread-safe; each thread makes it current before use, see `bind`).
unsafe impl Send for PrimaryContext {}
// SAFETY: as above; shared references only read the handle value.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retain the device's primary context.
    pub fn retain(device: Device) -> DriverResult<PrimaryContext> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one context handle for a valid device.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device.0) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(PrimaryContext { raw, device })
    }

    /// Reset the device's primary context: destroys every allocation and module in
    /// it. The only way back from a sticky kernel fault.
    pub(in crate::backend) fn reset_device(device: Device) -> DriverResult<()> {
        // SAFETY: valid device handle; callers guarantee no live handle of theirs is
        // used afterwards (the backend's epoch check enforces it).
        check(
            unsafe { sys::cuDevicePrimaryCtxReset_v2(device.0) },
            "cuDevicePrimaryCtxReset_v2",
        )
    }

    /// Make this context current on the calling thread (cheap when it already is).
    #[inline]
    pub fn bind(&self) -> DriverResult<()> {
        let mut current = std::ptr::null_mut();
        // SAFETY: writes one handle.
        let status = unsafe { sys::cuCtxGetCurrent(&mut current) };
        if status == sys::CUresult::CUDA_SUCCESS && current == self.raw {
            return Ok(());
        }
        // SAFETY: self.raw is a retained, live context.
        check(unsafe { sys::cuCtxSetCurrent(self.raw) }, "cuCtxSetCurrent")
    }

    /// Device of the context.
    pub fn device(&self) -> Device {
        self.device
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balanced with the retain in `retain`; errors are ignored on drop.
        unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device.0);
        }
    }
}

/// `cuMemGetInfo`: (free, total) bytes of the current context's device.
pub fn memory_info() -> DriverResult<(u64, u64)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two size_t; a context is current (callers bind first).
    check(
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        "cuMemGetInfo_v2",
    )?;
    Ok((free as u64, total as u64))
}

/// `cuDeviceCanAccessPeer(device, peer)`: whether `device` can address `peer`'s
/// memory directly (peer-to-peer over NVLink or PCIe).
pub fn can_access_peer(device: Device, peer: Device) -> DriverResult<bool> {
    let mut can = 0;
    // SAFETY: writes one int for two valid device handles.
    check(
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, device.0, peer.0) },
        "cuDeviceCanAccessPeer",
    )?;
    Ok(can != 0)
}

impl PrimaryContext {
    /// Let this context address `peer`'s allocations directly
    /// (`cuCtxEnablePeerAccess`, with this context bound). Enabling an access that is
    /// already on is not an error: a stitch asks for it every time it is built.
    pub fn enable_peer_access(&self, peer: &PrimaryContext) -> DriverResult<()> {
        self.bind()?;
        // SAFETY: `peer.raw` is a retained, live context; this context is current.
        let status = unsafe { sys::cuCtxEnablePeerAccess(peer.raw, 0) };
        if status == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(status, "cuCtxEnablePeerAccess")
    }
}

//! Our repr(C) types and constants (crate cgpu-ffi, and the shim's own
//! descriptor structs) against the real cuda.h / nvml.h: a C program
//! compiled against the headers prints sizeof/offsetof/values, which must
//! equal ours.

use cgpu_ffi::*;
use cgpu_sim::cuda::array::{Memcpy3D, ResourceDesc, ResourceViewDesc, TextureDesc};
use cgpu_sim::cuda::graph::{
    ConditionalNodeParams, GraphNodeParams, HostNodeParams, InstantiateParams, KernelNodeParams,
    KernelNodeParamsV2, MemAllocNodeParams, MemcpyNodeParams, MemsetNodeParams,
};
use cgpu_sim::cuda::memory::CudaMemcpy2D;
use cgpu_sim::cuda::unsupported::DevProp;
use cgpu_sim::nvml_monitoring::{Bar1Memory, DriverBranchInfo, EventData, ViolationTime};
use std::mem::{offset_of, size_of};

macro_rules! checks {
    ($($c:expr => $r:expr),* $(,)?) => { vec![$(($c.to_string(), $r as i64)),*] };
}

#[test]
fn ffi_matches_the_real_headers() {
    let mut v: Vec<(String, i64)> = checks![
        "sizeof(CUresult)" => size_of::<CUresult>(),
        "sizeof(CUdevice)" => size_of::<CUdevice>(),
        "sizeof(CUdeviceptr)" => size_of::<CUdeviceptr>(),
        "sizeof(unsigned int)" => size_of::<CUdeviceptr_v1>(),
        "sizeof(CUmemGenericAllocationHandle)" => size_of::<CUmemGenericAllocationHandle>(),
        "(long long)CU_STREAM_LEGACY" => CU_STREAM_LEGACY,
        "(long long)CU_STREAM_PER_THREAD" => CU_STREAM_PER_THREAD,
        "CU_GET_PROC_ADDRESS_DEFAULT" => CU_GET_PROC_ADDRESS_DEFAULT,
        "CU_GET_PROC_ADDRESS_LEGACY_STREAM" => CU_GET_PROC_ADDRESS_LEGACY_STREAM,
        "CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM" => CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
        "CU_GET_PROC_ADDRESS_SUCCESS" => CU_GET_PROC_ADDRESS_SUCCESS,
        "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND" => CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT" => CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
        "CU_DEVICE_ATTRIBUTE_MAX" => CU_DEVICE_ATTRIBUTE_MAX,
        "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT" => CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR" => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR" => CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID" => CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
        "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED" => CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED" => CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        "CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR" => CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
        "(long long)CU_LAUNCH_PARAM_END" => CU_LAUNCH_PARAM_END,
        "(long long)CU_LAUNCH_PARAM_BUFFER_POINTER" => CU_LAUNCH_PARAM_BUFFER_POINTER,
        "(long long)CU_LAUNCH_PARAM_BUFFER_SIZE" => CU_LAUNCH_PARAM_BUFFER_SIZE,
        "sizeof(CUlaunchAttribute)" => size_of::<CUlaunchAttribute>(),
        "offsetof(CUlaunchAttribute, value)" => offset_of!(CUlaunchAttribute, value),
        "sizeof(CUlaunchConfig)" => size_of::<CUlaunchConfig>(),
        "offsetof(CUlaunchConfig, sharedMemBytes)" => offset_of!(CUlaunchConfig, sharedMemBytes),
        "offsetof(CUlaunchConfig, hStream)" => offset_of!(CUlaunchConfig, hStream),
        "offsetof(CUlaunchConfig, attrs)" => offset_of!(CUlaunchConfig, attrs),
        "offsetof(CUlaunchConfig, numAttrs)" => offset_of!(CUlaunchConfig, numAttrs),
        "sizeof(CUctxCreateParams)" => size_of::<CUctxCreateParams>(),
        "offsetof(CUctxCreateParams, numExecAffinityParams)" => offset_of!(CUctxCreateParams, numExecAffinityParams),
        "offsetof(CUctxCreateParams, cigParams)" => offset_of!(CUctxCreateParams, cigParams),
        "sizeof(cuuint64_t)" => size_of::<cuuint64_t>(),
        "sizeof(CUDA_LAUNCH_PARAMS)" => size_of::<CUDA_LAUNCH_PARAMS>(),
        "offsetof(CUDA_LAUNCH_PARAMS, sharedMemBytes)" => offset_of!(CUDA_LAUNCH_PARAMS, sharedMemBytes),
        "offsetof(CUDA_LAUNCH_PARAMS, hStream)" => offset_of!(CUDA_LAUNCH_PARAMS, hStream),
        "offsetof(CUDA_LAUNCH_PARAMS, kernelParams)" => offset_of!(CUDA_LAUNCH_PARAMS, kernelParams),
        "sizeof(CUuuid)" => size_of::<CUuuid>(),
        "sizeof(CUmemLocation)" => size_of::<CUmemLocation>(),
        "offsetof(CUmemLocation, id)" => offset_of!(CUmemLocation, id),
        "sizeof(CUmemAllocationProp)" => size_of::<CUmemAllocationProp>(),
        "offsetof(CUmemAllocationProp, requestedHandleTypes)" => offset_of!(CUmemAllocationProp, requestedHandleTypes),
        "offsetof(CUmemAllocationProp, location)" => offset_of!(CUmemAllocationProp, location),
        "offsetof(CUmemAllocationProp, win32HandleMetaData)" => offset_of!(CUmemAllocationProp, win32HandleMetaData),
        "offsetof(CUmemAllocationProp, allocFlags)" => offset_of!(CUmemAllocationProp, allocFlags),
        "sizeof(CUmemAccessDesc)" => size_of::<CUmemAccessDesc>(),
        "offsetof(CUmemAccessDesc, flags)" => offset_of!(CUmemAccessDesc, flags),
        "sizeof(CUmemPoolProps)" => size_of::<CUmemPoolProps>(),
        "offsetof(CUmemPoolProps, handleTypes)" => offset_of!(CUmemPoolProps, handleTypes),
        "offsetof(CUmemPoolProps, location)" => offset_of!(CUmemPoolProps, location),
        "sizeof(CUDA_ARRAY_DESCRIPTOR)" => size_of::<CUDA_ARRAY_DESCRIPTOR>(),
        "offsetof(CUDA_ARRAY_DESCRIPTOR, Format)" => offset_of!(CUDA_ARRAY_DESCRIPTOR, Format),
        "offsetof(CUDA_ARRAY_DESCRIPTOR, NumChannels)" => offset_of!(CUDA_ARRAY_DESCRIPTOR, NumChannels),
        "sizeof(CUDA_ARRAY3D_DESCRIPTOR)" => size_of::<CUDA_ARRAY3D_DESCRIPTOR>(),
        "offsetof(CUDA_ARRAY3D_DESCRIPTOR, Depth)" => offset_of!(CUDA_ARRAY3D_DESCRIPTOR, Depth),
        "offsetof(CUDA_ARRAY3D_DESCRIPTOR, Flags)" => offset_of!(CUDA_ARRAY3D_DESCRIPTOR, Flags),
        "NVML_ERROR_LIBRARY_NOT_FOUND" => NVML_ERROR_LIBRARY_NOT_FOUND,
        "CU_EVENT_DEFAULT" => CU_EVENT_DEFAULT,
        "CU_EVENT_BLOCKING_SYNC" => CU_EVENT_BLOCKING_SYNC,
        "CU_EVENT_DISABLE_TIMING" => CU_EVENT_DISABLE_TIMING,
        "CU_EVENT_INTERPROCESS" => CU_EVENT_INTERPROCESS,
        "CU_STREAM_DEFAULT" => CU_STREAM_DEFAULT,
        "CU_STREAM_NON_BLOCKING" => CU_STREAM_NON_BLOCKING,
        "CU_MEM_ATTACH_GLOBAL" => CU_MEM_ATTACH_GLOBAL,
        "CU_MEM_ATTACH_HOST" => CU_MEM_ATTACH_HOST,
        "CU_MEM_ATTACH_SINGLE" => CU_MEM_ATTACH_SINGLE,
        // NVML
        "sizeof(nvmlMemory_t)" => size_of::<nvmlMemory_t>(),
        "sizeof(nvmlMemory_v2_t)" => size_of::<nvmlMemory_v2_t>(),
        "offsetof(nvmlMemory_v2_t, total)" => offset_of!(nvmlMemory_v2_t, total),
        "offsetof(nvmlMemory_v2_t, used)" => offset_of!(nvmlMemory_v2_t, used),
        "nvmlMemory_v2" => nvmlMemory_v2,
        "sizeof(nvmlProcessInfo_v1_t)" => size_of::<nvmlProcessInfo_v1_t>(),
        "sizeof(nvmlProcessInfo_t)" => size_of::<nvmlProcessInfo_t>(),
        "offsetof(nvmlProcessInfo_t, usedGpuMemory)" => offset_of!(nvmlProcessInfo_t, usedGpuMemory),
        "offsetof(nvmlProcessInfo_t, computeInstanceId)" => offset_of!(nvmlProcessInfo_t, computeInstanceId),
        "sizeof(nvmlUtilization_t)" => size_of::<nvmlUtilization_t>(),
        "sizeof(nvmlProcessUtilizationSample_t)" => size_of::<nvmlProcessUtilizationSample_t>(),
        "offsetof(nvmlProcessUtilizationSample_t, smUtil)" => offset_of!(nvmlProcessUtilizationSample_t, smUtil),
        "sizeof(nvmlPciInfo_t)" => size_of::<nvmlPciInfo_t>(),
        "offsetof(nvmlPciInfo_t, pciSubSystemId)" => offset_of!(nvmlPciInfo_t, pciSubSystemId),
        "offsetof(nvmlPciInfo_t, busId)" => offset_of!(nvmlPciInfo_t, busId),
        "NVML_DEVICE_NAME_BUFFER_SIZE" => NVML_DEVICE_NAME_BUFFER_SIZE,
        "NVML_DEVICE_NAME_V2_BUFFER_SIZE" => NVML_DEVICE_NAME_V2_BUFFER_SIZE,
        "NVML_DEVICE_UUID_BUFFER_SIZE" => NVML_DEVICE_UUID_BUFFER_SIZE,
        "NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE" => NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE,
        "(long long)NVML_VALUE_NOT_AVAILABLE" => NVML_VALUE_NOT_AVAILABLE_ULL as i64,
        // The shim's own descriptor structs
        "sizeof(CUDA_MEMCPY2D)" => size_of::<CudaMemcpy2D>(),
        "offsetof(CUDA_MEMCPY2D, srcPitch)" => offset_of!(CudaMemcpy2D, src_pitch),
        "offsetof(CUDA_MEMCPY2D, dstMemoryType)" => offset_of!(CudaMemcpy2D, dst_memory_type),
        "offsetof(CUDA_MEMCPY2D, dstArray)" => offset_of!(CudaMemcpy2D, dst_array),
        "offsetof(CUDA_MEMCPY2D, Height)" => offset_of!(CudaMemcpy2D, height),
        "offsetof(CUDA_KERNEL_NODE_PARAMS, kernelParams)" => offset_of!(KernelNodeParams, kernel_params),
        "offsetof(CUDA_KERNEL_NODE_PARAMS, extra)" => offset_of!(KernelNodeParams, extra),
        "offsetof(CUDA_KERNEL_NODE_PARAMS_v1, extra)" => offset_of!(KernelNodeParams, extra),
        "sizeof(CUDA_KERNEL_NODE_PARAMS_v2)" => size_of::<KernelNodeParamsV2>(),
        "offsetof(CUDA_KERNEL_NODE_PARAMS_v2, ctx)" => offset_of!(KernelNodeParamsV2, ctx),
        "sizeof(CUDA_MEMCPY3D)" => size_of::<Memcpy3D>(),
        "offsetof(CUDA_MEMCPY3D, srcMemoryType)" => offset_of!(Memcpy3D, src_memory_type),
        "offsetof(CUDA_MEMCPY3D, srcArray)" => offset_of!(Memcpy3D, src_array),
        "offsetof(CUDA_MEMCPY3D, srcHeight)" => offset_of!(Memcpy3D, src_height),
        "offsetof(CUDA_MEMCPY3D, dstMemoryType)" => offset_of!(Memcpy3D, dst_memory_type),
        "offsetof(CUDA_MEMCPY3D, dstPitch)" => offset_of!(Memcpy3D, dst_pitch),
        "offsetof(CUDA_MEMCPY3D, Depth)" => offset_of!(Memcpy3D, depth),
        "sizeof(CUDA_MEMCPY3D_PEER)" => size_of::<Memcpy3D>(),
        "offsetof(CUDA_MEMCPY3D_PEER, srcContext)" => offset_of!(Memcpy3D, reserved0),
        "offsetof(CUDA_MEMCPY3D_PEER, dstContext)" => offset_of!(Memcpy3D, reserved1),
        "sizeof(CUDA_MEMSET_NODE_PARAMS)" => size_of::<MemsetNodeParams>(),
        "offsetof(CUDA_MEMSET_NODE_PARAMS, elementSize)" => offset_of!(MemsetNodeParams, element_size),
        "offsetof(CUDA_MEMSET_NODE_PARAMS, height)" => offset_of!(MemsetNodeParams, height),
        "sizeof(CUDA_HOST_NODE_PARAMS)" => size_of::<HostNodeParams>(),
        "sizeof(CUDA_MEM_ALLOC_NODE_PARAMS)" => size_of::<MemAllocNodeParams>(),
        "offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, accessDescs)" => offset_of!(MemAllocNodeParams, access_descs),
        "offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize)" => offset_of!(MemAllocNodeParams, bytesize),
        "offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr)" => offset_of!(MemAllocNodeParams, dptr),
        "sizeof(CUDA_CONDITIONAL_NODE_PARAMS)" => size_of::<ConditionalNodeParams>(),
        "offsetof(CUDA_CONDITIONAL_NODE_PARAMS, size)" => offset_of!(ConditionalNodeParams, size),
        "offsetof(CUDA_CONDITIONAL_NODE_PARAMS, phGraph_out)" => offset_of!(ConditionalNodeParams, graph_out),
        "sizeof(CUDA_MEMCPY_NODE_PARAMS)" => size_of::<MemcpyNodeParams>(),
        "offsetof(CUDA_MEMCPY_NODE_PARAMS, copyParams)" => offset_of!(MemcpyNodeParams, copy),
        "sizeof(CUgraphNodeParams)" => size_of::<GraphNodeParams>(),
        "offsetof(CUgraphNodeParams, kernel)" => offset_of!(GraphNodeParams, u),
        "offsetof(CUgraphNodeParams, reserved2)" => offset_of!(GraphNodeParams, reserved2),
        "sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS)" => size_of::<InstantiateParams>(),
        "offsetof(CUDA_GRAPH_INSTANTIATE_PARAMS, result_out)" => offset_of!(InstantiateParams, result_out),
        "sizeof(CUDA_RESOURCE_DESC)" => size_of::<ResourceDesc>(),
        "offsetof(CUDA_RESOURCE_DESC, res)" => offset_of!(ResourceDesc, res),
        "offsetof(CUDA_RESOURCE_DESC, flags)" => offset_of!(ResourceDesc, flags),
        "sizeof(CUDA_TEXTURE_DESC)" => size_of::<TextureDesc>(),
        "offsetof(CUDA_TEXTURE_DESC, borderColor)" => offset_of!(TextureDesc, border_color),
        "sizeof(CUDA_RESOURCE_VIEW_DESC)" => size_of::<ResourceViewDesc>(),
        "offsetof(CUDA_RESOURCE_VIEW_DESC, firstMipmapLevel)" => offset_of!(ResourceViewDesc, first_mipmap_level),
        "sizeof(CUdevprop)" => size_of::<DevProp>(),
        "offsetof(CUdevprop, textureAlign)" => offset_of!(DevProp, texture_align),
        "sizeof(nvmlBAR1Memory_t)" => size_of::<Bar1Memory>(),
        "sizeof(nvmlViolationTime_t)" => size_of::<ViolationTime>(),
        "sizeof(nvmlSystemDriverBranchInfo_t)" => size_of::<DriverBranchInfo>(),
        "nvmlSystemDriverBranchInfo_v1" => 0x0100_0054,
        "sizeof(nvmlEventData_t)" => size_of::<EventData>(),
        "offsetof(nvmlEventData_t, computeInstanceId)" => offset_of!(EventData, compute_instance_id),
    ];
    // CUDA 12's cuda.h (the one C clients build against) ends at 916; the
    // codes CUDA 13 added are checked against CUDA 13's cuda.h below.
    let mut v13: Vec<(String, i64)> = Vec::new();
    for (val, name, _) in CU_RESULTS {
        let list = if *val > CUDA_ERROR_KEY_ROTATION && *val != CUDA_ERROR_UNKNOWN {
            &mut v13
        } else {
            &mut v
        };
        list.push((name.to_string(), *val as i64));
    }
    for (name, val) in [
        ("NVML_SUCCESS", NVML_SUCCESS),
        ("NVML_ERROR_UNINITIALIZED", NVML_ERROR_UNINITIALIZED),
        ("NVML_ERROR_INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT),
        ("NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED),
        ("NVML_ERROR_NO_PERMISSION", NVML_ERROR_NO_PERMISSION),
        (
            "NVML_ERROR_ALREADY_INITIALIZED",
            NVML_ERROR_ALREADY_INITIALIZED,
        ),
        ("NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND),
        ("NVML_ERROR_INSUFFICIENT_SIZE", NVML_ERROR_INSUFFICIENT_SIZE),
        ("NVML_ERROR_DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED),
        (
            "NVML_ERROR_FUNCTION_NOT_FOUND",
            NVML_ERROR_FUNCTION_NOT_FOUND,
        ),
        ("NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST),
        ("NVML_ERROR_NO_DATA", NVML_ERROR_NO_DATA),
        (
            "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        ),
        ("NVML_ERROR_GPU_NOT_FOUND", NVML_ERROR_GPU_NOT_FOUND),
        ("NVML_ERROR_UNKNOWN", NVML_ERROR_UNKNOWN),
    ] {
        v.push((name.to_string(), val as i64));
    }

    let mut c = String::from("#include <cuda.h>\n#include <nvml.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n");
    for (i, (expr, _)) in v.iter().enumerate() {
        c += &format!("    printf(\"{i} %lld\\n\", (long long)({expr}));\n");
    }
    c += "    return 0;\n}\n";
    let dir = cgpu_testkit::artifacts().profile_dir.join("c-clients");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("abi_dump.c");
    if std::fs::read_to_string(&src).ok().as_deref() != Some(c.as_str()) {
        std::fs::write(&src, &c).unwrap();
    }
    let bin = cgpu_testkit::compile_c(&src, &[], cgpu_testkit::LinkMode::Dlsym);
    let o = std::process::Command::new(&bin).output().unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    let mut bad = Vec::new();
    for l in out.lines() {
        let (i, val) = l.split_once(' ').unwrap();
        let (expr, ours) = &v[i.parse::<usize>().unwrap()];
        let real: i64 = val.parse().unwrap();
        if real != *ours {
            bad.push(format!("{expr}: header {real}, ours {ours}"));
        }
    }
    assert_eq!(out.lines().count(), v.len());
    assert!(bad.is_empty(), "ABI mismatches:\n{}", bad.join("\n"));

    // The codes only CUDA 13's cuda.h has.
    assert!(!v13.is_empty());
    let mut c = String::from("#include <cuda.h>\n#include <stdio.h>\nint main(void) {\n");
    for (expr, ours) in &v13 {
        c += &format!("    if ((long long)({expr}) != {ours}LL) printf(\"{expr}: header %lld, ours {ours}\\n\", (long long)({expr}));\n");
    }
    c += "    return 0;\n}\n";
    let src = dir.join("abi_dump13.c");
    std::fs::write(&src, &c).unwrap();
    let bin = dir.join(format!("abi_dump13-{}", std::process::id()));
    let cu13 = cgpu_testkit::test_deps()
        .venv
        .join("cuda13/nvidia/cu13/include");
    let g = std::process::Command::new("gcc")
        .arg(format!("-I{}", cu13.display()))
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let o = std::process::Command::new(&bin).output().unwrap();
    let _ = std::fs::remove_file(&bin);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.is_empty(), "ABI mismatches (CUDA 13):\n{out}");
}

//! Modules and libraries: the fake runs no kernels, so every way of loading code
//! (`cuModuleLoad`, `cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`,
//! `cuLibraryLoadData`, `cuLibraryLoadFromFile`) returns `CUDA_ERROR_NOT_SUPPORTED` (801,
//! "operation not supported") and writes nothing. Code that loads a module needs a GPU.

use std::ffi::{c_char, c_uint, c_void};

use cuda_dl_sys::types::{CUjit_option, CUlibrary, CUlibraryOption, CUmodule};

use crate::errors::{NOT_SUPPORTED, Res};

export!("cuModuleLoad", cuModuleLoad => module_load(module: *mut CUmodule, fname: *const c_char));
unsafe fn module_load(_module: *mut CUmodule, _file: *const c_char) -> Res {
    Err(NOT_SUPPORTED)
}

export!("cuModuleLoadData", cuModuleLoadData => module_load_data(module: *mut CUmodule, image: *const c_void));
unsafe fn module_load_data(_module: *mut CUmodule, _image: *const c_void) -> Res {
    Err(NOT_SUPPORTED)
}

export!("cuModuleLoadDataEx", cuModuleLoadDataEx => module_load_data_ex(module: *mut CUmodule, image: *const c_void, numOptions: c_uint, options: *mut CUjit_option, optionValues: *mut *mut c_void));
unsafe fn module_load_data_ex(
    _module: *mut CUmodule,
    _image: *const c_void,
    _count: c_uint,
    _options: *mut CUjit_option,
    _values: *mut *mut c_void,
) -> Res {
    Err(NOT_SUPPORTED)
}

export!("cuModuleLoadFatBinary", cuModuleLoadFatBinary => module_load_fat_binary(module: *mut CUmodule, fatCubin: *const c_void));
unsafe fn module_load_fat_binary(_module: *mut CUmodule, _image: *const c_void) -> Res {
    Err(NOT_SUPPORTED)
}

export!("cuLibraryLoadData", cuLibraryLoadData => library_load_data(library: *mut CUlibrary, code: *const c_void, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint));
#[allow(clippy::too_many_arguments)]
unsafe fn library_load_data(
    _library: *mut CUlibrary,
    _code: *const c_void,
    _jit_options: *mut CUjit_option,
    _jit_values: *mut *mut c_void,
    _jit_count: c_uint,
    _options: *mut CUlibraryOption,
    _values: *mut *mut c_void,
    _count: c_uint,
) -> Res {
    Err(NOT_SUPPORTED)
}

export!("cuLibraryLoadFromFile", cuLibraryLoadFromFile => library_load_from_file(library: *mut CUlibrary, fileName: *const c_char, jitOptions: *mut CUjit_option, jitOptionsValues: *mut *mut c_void, numJitOptions: c_uint, libraryOptions: *mut CUlibraryOption, libraryOptionValues: *mut *mut c_void, numLibraryOptions: c_uint));
#[allow(clippy::too_many_arguments)]
unsafe fn library_load_from_file(
    _library: *mut CUlibrary,
    _file: *const c_char,
    _jit_options: *mut CUjit_option,
    _jit_values: *mut *mut c_void,
    _jit_count: c_uint,
    _options: *mut CUlibraryOption,
    _values: *mut *mut c_void,
    _count: c_uint,
) -> Res {
    Err(NOT_SUPPORTED)
}

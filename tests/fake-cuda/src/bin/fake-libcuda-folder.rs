//! Makes a folder where `libcuda.so.1` and `libcuda.so` are the fake driver, and prints its path:
//! put it first on `LD_LIBRARY_PATH` of another program, and any binding in it that opens the
//! driver by name (cudarc opens `libcuda.so`, others `libcuda.so.1`) loads the fake.
//!
//! ```text
//! LD_LIBRARY_PATH="$(cargo run -q -p fake-cuda --bin fake-libcuda-folder)" my-cuda-program
//! cargo run -q -p fake-cuda --bin fake-libcuda-folder -- /tmp/fake-libcuda   # a folder of your own
//! ```
//!
//! Without an argument, the folder is `fake-libcuda/` beside the library Cargo built for this
//! command (`target/<profile>/`); the links point at that library (`target/<profile>/deps/libfake_cuda.so`;
//! `FAKE_CUDA_LIBRARY` names another). The fake runs on Linux only: elsewhere this says so and
//! fails.

use std::path::PathBuf;
use std::process::ExitCode;

use fake_cuda::steer;

fn main() -> ExitCode {
    match run() {
        Ok(folder) => {
            println!("{}", folder.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fake-libcuda-folder: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let folder = args.next().map(PathBuf::from);
    if args.next().is_some() {
        return Err("takes at most one argument, the folder to make (usage: \
                    fake-libcuda-folder [FOLDER])"
            .into());
    }
    let library = library()?;
    let folder = match folder {
        Some(folder) => folder,
        None => library
            .parent()
            .map_or_else(|| PathBuf::from("fake-libcuda"), |p| p.join("fake-libcuda")),
    };
    let folder = steer::libcuda_folder(&library, &folder)?;
    Ok(folder.canonicalize().unwrap_or(folder))
}

/// The library Cargo built for this command: `target/<profile>/deps/`, beside which this program
/// is built (a `target/<profile>/libfake_cuda.so` that an earlier `cargo build -p fake-cuda` left
/// may be older); [`steer::locate`]'s answer where that is not so or `FAKE_CUDA_LIBRARY` is set.
fn library() -> Result<PathBuf, steer::FakeError> {
    let built = std::env::current_exe().ok().and_then(|exe| {
        let built = exe.parent()?.join("deps").join(steer::library_file_name());
        built.is_file().then_some(built)
    });
    match built {
        Some(built) if std::env::var_os(steer::LIBRARY_ENV).is_none() => {
            Ok(built.canonicalize().unwrap_or(built))
        }
        _ => steer::locate(),
    }
}

//! Compiles `spec/abhyasa.proto` with `protox` (pure Rust, no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../spec/abhyasa.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["../spec"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}

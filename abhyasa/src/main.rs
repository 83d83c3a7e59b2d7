//! The `abhyasa` command line.

fn main() {
    println!("abhyasa {}", env!("CARGO_PKG_VERSION"));
}

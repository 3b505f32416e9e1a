// rusthog keeps allocating 1 MiB blocks until the allocator is refused: what a Rust
// wasm32-wasi guest does when memory.grow returns -1.
fn main() {
    let mut kept: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut b = vec![0u8; 1 << 20];
        b[0] = 1;
        kept.push(b);
        println!("holding {} MiB", kept.len());
    }
}

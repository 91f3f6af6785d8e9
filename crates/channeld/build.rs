//! Link with packed relative relocations (`DT_RELR`), as every daemon is: the loader's table of
//! pointers to relocate at start shrinks from hundreds of kilobytes, all of it resident, to a
//! few; the binary stays position-independent (docs/performance.md, "How every daemon is built").

fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

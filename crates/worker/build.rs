//! Generates the Cap'n Proto bindings from `schema/worker.capnp`. Needs the
//! `capnp` schema compiler on PATH (Debian: `apt-get install capnproto`;
//! `.ci/apt-packages` lists it).

fn main() {
    println!("cargo:rerun-if-changed=schema/worker.capnp");
    if let Err(e) = capnpc::CompilerCommand::new()
        .src_prefix("schema")
        .import_path("schema")
        .file("schema/worker.capnp")
        .run()
    {
        panic!(
            "compiling schema/worker.capnp failed: {e}\n\
             the `capnp` schema compiler must be on PATH: `apt-get install capnproto`"
        );
    }
}

# Cap'n Proto's standard streaming marker (upstream c++/src/capnp/stream.capnp,
# MIT), vendored because Debian's `capnproto` package ships the compiler
# without its standard schemas (those are in libcapnp-dev). The ids must be
# upstream's: the compiler and capnp-rpc recognise `-> stream` by them.
@0x86c366a91393f3f8;

struct StreamResult @0x995f9a3377c0b16e {
  # Empty struct that serves as the return type for "streaming" methods.
}

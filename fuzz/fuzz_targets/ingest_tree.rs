#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fhsx_fuzz::ingest_tree(data));

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| fhsx_fuzz::lock_parse(data));

#![no_main]
// castore contains the `ar` crate's panics on malformed .deb headers with
// catch_unwind (a clear error instead); libFuzzer's panic hook would abort
// on those contained panics too, so restore the default hook. A panic that
// escapes import still aborts (libfuzzer-sys catches it around each input).
libfuzzer_sys::fuzz_target!(
    init: {
        let _ = std::panic::take_hook();
    },
    |data: &[u8]| fhsx_fuzz::archive_import(data)
);

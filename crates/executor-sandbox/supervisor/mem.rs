//! The memory functions the compiler calls (for copies, fills and
//! comparisons it emits) and a libc would provide. Written so the
//! compiler cannot turn them back into calls to themselves: `rep`
//! string instructions on x86_64, volatile byte loops elsewhere. The
//! supervisor's copies are small (lines, paths, proxy buffers).

#[cfg(target_arch = "x86_64")]
#[no_mangle]
unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    core::arch::asm!(
        "rep movsb",
        inout("rcx") n => _,
        inout("rdi") dst => _,
        inout("rsi") src => _,
        options(nostack, preserves_flags)
    );
    dst
}

#[cfg(target_arch = "x86_64")]
#[no_mangle]
unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    core::arch::asm!(
        "rep stosb",
        inout("rcx") n => _,
        inout("rdi") dst => _,
        in("al") c as u8,
        options(nostack, preserves_flags)
    );
    dst
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        core::ptr::write_volatile(dst.add(i), core::ptr::read_volatile(src.add(i)));
    }
    dst
}

#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
unsafe extern "C" fn memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        core::ptr::write_volatile(dst.add(i), c as u8);
    }
    dst
}

#[no_mangle]
unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dst as usize) <= (src as usize) || (dst as usize) >= (src as usize) + n {
        for i in 0..n {
            core::ptr::write_volatile(dst.add(i), core::ptr::read_volatile(src.add(i)));
        }
    } else {
        for i in (0..n).rev() {
            core::ptr::write_volatile(dst.add(i), core::ptr::read_volatile(src.add(i)));
        }
    }
    dst
}

#[no_mangle]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        let (x, y) = (
            core::ptr::read_volatile(a.add(i)),
            core::ptr::read_volatile(b.add(i)),
        );
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

#[no_mangle]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    memcmp(a, b, n)
}

#[no_mangle]
unsafe extern "C" fn strlen(s: *const u8) -> usize {
    let mut n = 0;
    while core::ptr::read_volatile(s.add(n)) != 0 {
        n += 1;
    }
    n
}

/// Named by `core`'s precompiled code; never called, since the
/// supervisor is built with `panic=abort`.
#[no_mangle]
extern "C" fn rust_eh_personality() {}

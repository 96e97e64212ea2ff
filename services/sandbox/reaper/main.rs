//! The program a sandbox's keeper runs once its sandbox is made: the first process of the
//! session's PID namespace, reaping whatever is orphaned there until it is killed.
//!
//! It is a program of its own, a few hundred bytes with no libc and no allocator, rather than
//! code of the node's, so the keeper shares nothing with the node (not its memory, not its
//! descriptors) and costs a session a few KiB: the kernel's OOM killer may then pick it like
//! any other process of the session's cgroup without touching the node. `build.rs` compiles
//! it for the crate's target; the node runs it from a sealed memfd (see `keeper.rs`).
//!
//! What it does: names itself `plinth-keeper`, blocks every signal (as the first process of
//! a PID namespace it gets none it does not handle from inside; SIGKILL from the node still
//! ends it), then waits for children forever.

#![no_std]
#![no_main]

#[cfg(target_arch = "x86_64")]
mod sys {
    pub const WAIT4: usize = 61;
    pub const RT_SIGPROCMASK: usize = 14;
    pub const RT_SIGTIMEDWAIT: usize = 128;
    pub const PRCTL: usize = 157;
    pub const EXIT: usize = 60;

    /// A system call with up to four arguments.
    #[inline(always)]
    pub unsafe fn call(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
        let ret: isize;
        // SAFETY: the caller passes arguments valid for system call `n`.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") n as isize => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                in("r10") d,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }
}

#[cfg(target_arch = "aarch64")]
mod sys {
    pub const WAIT4: usize = 260;
    pub const RT_SIGPROCMASK: usize = 135;
    pub const RT_SIGTIMEDWAIT: usize = 137;
    pub const PRCTL: usize = 167;
    pub const EXIT: usize = 93;

    /// A system call with up to four arguments.
    #[inline(always)]
    pub unsafe fn call(n: usize, a: usize, b: usize, c: usize, d: usize) -> isize {
        let ret: isize;
        // SAFETY: the caller passes arguments valid for system call `n`.
        unsafe {
            core::arch::asm!(
                "svc 0",
                in("x8") n,
                inlateout("x0") a as isize => ret,
                in("x1") b,
                in("x2") c,
                in("x3") d,
                options(nostack),
            );
        }
        ret
    }
}

const WNOHANG: usize = 1;
const SIG_SETMASK: usize = 2;
const PR_SET_NAME: usize = 15;
/// SIGCHLD (17) in a kernel signal set.
const SIGCHLD_SET: u64 = 1 << (17 - 1);
/// The kernel's signal set size, in bytes.
const SET_BYTES: usize = 8;

#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    let all: u64 = !0;
    let child: u64 = SIGCHLD_SET;
    let name = b"plinth-keeper\0";
    // SAFETY: system calls on this process's own name, signal mask and children, with
    // pointers to live locals.
    unsafe {
        sys::call(sys::PRCTL, PR_SET_NAME, name.as_ptr() as usize, 0, 0);
        sys::call(
            sys::RT_SIGPROCMASK,
            SIG_SETMASK,
            &all as *const u64 as usize,
            0,
            SET_BYTES,
        );
        loop {
            // Every child that has ended, then sleep until the next one does (SIGCHLD stays
            // blocked and pending, so one that ends between the two is not missed).
            while sys::call(sys::WAIT4, usize::MAX, 0, WNOHANG, 0) > 0 {}
            sys::call(
                sys::RT_SIGTIMEDWAIT,
                &child as *const u64 as usize,
                0,
                0,
                SET_BYTES,
            );
        }
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {
        // SAFETY: ends this process.
        unsafe { sys::call(sys::EXIT, 127, 0, 0, 0) };
    }
}

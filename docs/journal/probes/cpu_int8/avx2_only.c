// The process sees a processor without AVX-512, VNNI or AMX, so ONNX Runtime's MLAS, torch and numpy
// pick the kernels an AVX2-only processor (AMD EPYC Rome / Milan, for one) gets; caches, memory and
// clocks stay this machine's. Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID; /proc/cpuinfo flag
// cpuid_fault) turns every CPUID into a SIGSEGV, which this handler answers with the feature bits
// cleared. A handler installed after it (Python's faulthandler, which pytest turns on) breaks it.
//   gcc -O2 -shared -fPIC -o /tmp/avx2_only.so docs/journal/probes/cpu_int8/avx2_only.c
//   LD_PRELOAD=/tmp/avx2_only.so python -c "import torch; print(torch.backends.cpu.get_cpu_capability())"  # AVX2
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#include <cpuid.h>

static long set_cpuid(int on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }
static struct sigaction previous;

static void on_segv(int sig, siginfo_t *info, void *ctx_) {
    ucontext_t *ctx = ctx_;
    greg_t *r = ctx->uc_mcontext.gregs;
    const uint8_t *ip = (const uint8_t *)r[REG_RIP];
    if (!(ip[0] == 0x0f && ip[1] == 0xa2)) {  // not CPUID: a real fault
        sigaction(SIGSEGV, &previous, NULL);
        return;  // re-executes and faults under the previous handler
    }
    uint32_t leaf = r[REG_RAX], sub = r[REG_RCX], a, b, c, d;
    set_cpuid(1);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_cpuid(0);
    if (leaf == 7 && sub == 0) {
        b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
        c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
    } else if (leaf == 7 && sub == 1) {
        a &= ~((1u << 4) | (1u << 5) | (1u << 23));
        d &= ~(1u << 4);
    }
    r[REG_RAX] = a; r[REG_RBX] = b; r[REG_RCX] = c; r[REG_RDX] = d;
    r[REG_RIP] += 2;
}

__attribute__((constructor)) static void mask_cpu(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, &previous);
    if (set_cpuid(0) != 0) {
        perror("avx2_only: CPUID faulting (arch_prctl ARCH_SET_CPUID)");
        exit(3);
    }
}

/* crash_report.c: a preloaded signal handler for a process that dies in native code (benchmarks/device.sh builds it when importing quantmatmul fails there): on SIGSEGV / SIGBUS / SIGILL / SIGFPE it prints, from an alternate stack (a stack overflow still reports), the faulting address, each frame's library and offset (for addr2line) and the registers.
 *
 *   gcc -shared -fPIC -O1 -o /tmp/crash_report.so benchmarks/crash_report.c
 *   LD_PRELOAD=/tmp/crash_report.so python3 -c "import quantmatmul"
 *   addr2line -f -C -i -e .../_core*.so OFFSET        (a build with -g: -C cmake.define.CMAKE_CXX_FLAGS=-g)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <ucontext.h>
#include <unistd.h>

static void where(const char* tag, void* p) {
  Dl_info info;
  if (dladdr(p, &info) && info.dli_fname)
    fprintf(stderr, "%s %p %s+0x%lx %s\n", tag, p, info.dli_fname, (unsigned long)((char*)p - (char*)info.dli_fbase),
            info.dli_sname ? info.dli_sname : "?");
  else
    fprintf(stderr, "%s %p ?\n", tag, p);
}

static void report(int sig, siginfo_t* si, void* context) {
  const greg_t* g = ((ucontext_t*)context)->uc_mcontext.gregs;
  fprintf(stderr, "crash_report: signal %d (code %d) at address %p\n", sig, si->si_code, si->si_addr);
  where("rip", (void*)g[REG_RIP]);
  void* frames[32];
  const int n = backtrace(frames, 32);
  for (int i = 0; i < n; i++) where("  frame", frames[i]);
  fprintf(stderr, "rsp %llx rbp %llx rax %llx rbx %llx rcx %llx rdx %llx rsi %llx rdi %llx r8 %llx r9 %llx\n",
          (unsigned long long)g[REG_RSP], (unsigned long long)g[REG_RBP], (unsigned long long)g[REG_RAX],
          (unsigned long long)g[REG_RBX], (unsigned long long)g[REG_RCX], (unsigned long long)g[REG_RDX],
          (unsigned long long)g[REG_RSI], (unsigned long long)g[REG_RDI], (unsigned long long)g[REG_R8],
          (unsigned long long)g[REG_R9]);
  _exit(128 + sig);
}

__attribute__((constructor)) static void install(void) {
  static char stack[1 << 20];
  stack_t alternate = {0};
  alternate.ss_sp = stack;
  alternate.ss_size = sizeof stack;
  sigaltstack(&alternate, 0);
  struct sigaction action = {0};
  action.sa_sigaction = report;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; i++) sigaction(signals[i], &action, 0);
}

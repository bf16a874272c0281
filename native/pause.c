/*
 * tsbox-pause: the sandbox process of a pod that names no command, as the Kubernetes pause is.
 * The supervisor (tsbox-shim) execs it once the sandbox's namespaces and cgroups are set up. It
 * holds the pod's namespaces, reaps every orphan the pod's containers leave to it (it is pid 1 of
 * the pod's pid namespace), and exits 0 on SIGTERM or SIGINT. Its one argument, the sandbox's
 * directory, is there for ps to show whose pause it is.
 *
 * It is built without a C library (no libc start-up, no stdio, no heap): a pod holds one for its
 * whole life, and what it costs is then a stack page and a few bytes of data, 8 KiB where a
 * program with glibc's static start-up costs 44 KiB of its own and a forked copy of the
 * supervisor more (bench/pods.ts --breakdown). It has no signal handler: the signals it acts on
 * are blocked and taken with rt_sigtimedwait, so no return trampoline is needed, and as pid 1 of
 * a namespace it receives only what it waits for. Every system call is checked: one that fails
 * where it must not ends the process with status 127, the reason on stderr (the pod's console log).
 */

typedef unsigned long u64;

#if defined(__x86_64__)
#define NR_WRITE 1
#define NR_RT_SIGPROCMASK 14
#define NR_WAIT4 61
#define NR_RT_SIGTIMEDWAIT 128
#define NR_EXIT_GROUP 231
static long sys4(long n, long a, long b, long c, long d) {
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
#define NR_WRITE 64
#define NR_RT_SIGPROCMASK 135
#define NR_WAIT4 260
#define NR_RT_SIGTIMEDWAIT 137
#define NR_EXIT_GROUP 94
static long sys4(long n, long a, long b, long c, long d) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
}
#else
#error "tsbox-pause knows the system calls of x86_64 and aarch64 only"
#endif

#define SIGINT 2
#define SIGTERM 15
#define SIGCHLD 17
#define SIG_BLOCK 0
#define WNOHANG 1
#define EINTR 4
#define EAGAIN 11
#define ECHILD 10
#define SIGSET_BYTES 8

static void leave(int status) {
  for (;;) sys4(NR_EXIT_GROUP, status, 0, 0, 0);
}

static void fail(const char *what, long err) {
  static const char prefix[] = "tsbox-pause: ";
  char msg[96];
  unsigned n = 0;
  for (const char *p = prefix; *p != '\0' && n < sizeof msg - 24; p++) msg[n++] = *p;
  for (const char *p = what; *p != '\0' && n < sizeof msg - 24; p++) msg[n++] = *p;
  static const char errno_is[] = " failed, errno ";
  for (const char *p = errno_is; *p != '\0'; p++) msg[n++] = *p;
  char digits[8];
  unsigned d = 0;
  unsigned long e = (unsigned long)-err;
  do digits[d++] = (char)('0' + e % 10), e /= 10;
  while (e != 0 && d < sizeof digits);
  while (d > 0) msg[n++] = digits[--d];
  msg[n++] = '\n';
  /* Nothing more can be done if the log cannot take it: the status says it failed. */
  (void)sys4(NR_WRITE, 2, (long)msg, (long)n, 0);
  leave(127);
}

/* Reaps every child that has ended; returns when none is left ended. */
static void reap(void) {
  for (;;) {
    long r = sys4(NR_WAIT4, -1, 0, WNOHANG, 0);
    if (r > 0) continue;
    if (r == 0 || r == -ECHILD) return;
    if (r != -EINTR) fail("wait4", r);
  }
}

static u64 bit(int sig) {
  return 1UL << (sig - 1);
}

static unsigned char info[128] __attribute__((aligned(8))); /* siginfo_t: read, not used */

#if defined(__x86_64__)
__attribute__((force_align_arg_pointer))
#endif
void _start(void) {
  u64 set = bit(SIGINT) | bit(SIGTERM) | bit(SIGCHLD);
  long r = sys4(NR_RT_SIGPROCMASK, SIG_BLOCK, (long)&set, 0, SIGSET_BYTES);
  if (r < 0) fail("rt_sigprocmask", r);
  /* Orphans that ended before the mask was set sent a SIGCHLD nobody waited for. */
  reap();
  for (;;) {
    long sig = sys4(NR_RT_SIGTIMEDWAIT, (long)&set, (long)info, 0, SIGSET_BYTES);
    if (sig == SIGTERM || sig == SIGINT) leave(0);
    if (sig == SIGCHLD) reap();
    else if (sig < 0 && sig != -EINTR && sig != -EAGAIN) fail("rt_sigtimedwait", sig);
  }
}

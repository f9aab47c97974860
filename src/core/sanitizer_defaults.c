/*
 * sanitizer_defaults.c — ThreadSanitizer's default options, in every program of a
 * SANITIZER=thread build: the Makefile links this object into each program (from
 * libflatshard.a the linker would keep the runtime's weak definition), and into nothing else.
 * TSAN_OPTIONS, when the user sets it, is parsed after these and overrides them flag by flag.
 *
 * no_huge_pages_for_shadow=0: TSan maps its shadow memory with MADV_NOHUGEPAGE by default,
 * so every 4 KiB of it the program touches costs a page fault, and the first write after a
 * read a copy-on-write fault with a TLB shootdown on every core. On `small`'s weights that was
 * most of the time: one step of `small` on 2 in-process ranks took 42-44 s (52-55 s of it in
 * the kernel) and 18-31 s (10-33 s) with huge pages allowed, at 2.5% more peak RSS (9.8 GB),
 * three runs each alternating (Xeon family 6 model 207, transparent_hugepage=madvise,
 * 2026-12-07). ASan's shadow gained nothing from it there (4.7-5.4 s either way), so ASan keeps
 * its default. What TSan checks is unchanged.
 */
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "no_huge_pages_for_shadow=0"; }

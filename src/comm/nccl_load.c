/*
 * nccl_load.c — the program's side of the NCCL backend: fs_comm_nccl_init checks its
 * arguments, loads libflatshard-nccl.so (built from nccl.c with make NCCL=1) the first time
 * it is asked for, and calls the library's table (comm_internal.h). The library is looked for
 * where the build puts it, by the CUDA device's loader (fs_device_dlopen_beside_binary):
 * FLATSHARD_NCCL_LIB if set, then beside the program, then one directory up (the test
 * programs live in build/tests/ and build/mpi_tests/).
 *
 * What this file does not do: anything with NCCL itself, so a program built with NCCL=1
 * still runs on a machine without CUDA or NCCL until a GPU run under MPI asks for it.
 */
#include "comm_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "flatshard/device.h"

int fs_comm_nccl_built(void) { return FS_HAVE_NCCL; }

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static const fs_nccl_api *nccl_api_table;
static char nccl_why[600];

static void load_nccl(void) {
    void *lib = fs_device_dlopen_beside_binary("FLATSHARD_NCCL_LIB", FS_NCCL_LIBRARY, nccl_why, sizeof nccl_why);
    if (!lib) return;
    nccl_api_table = dlsym(lib, FS_NCCL_API_SYMBOL);
    if (!nccl_api_table)
        snprintf(nccl_why, sizeof nccl_why, "%s has no %s: %s", FS_NCCL_LIBRARY, FS_NCCL_API_SYMBOL,
                 dlerror());
    /* kept loaded for the life of the process, like the CUDA device's library */
}

fs_status fs_comm_nccl_init(fs_comm *control, fs_device *dev, fs_comm **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_nccl_init: out is NULL");
    *out = NULL;
    if (!control) return fs_errorf(FS_ERR_USAGE, "fs_comm_nccl_init: control is NULL");
    if (!FS_HAVE_NCCL)
        return fs_errorf(FS_ERR_USAGE, "this build has no NCCL (built with make NCCL=0, or without "
                                       "nccl.h): several GPUs need it");
    if (!dev || fs_device_kind_of(dev) != FS_DEVICE_CUDA)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_nccl_init: NCCL needs a CUDA device");
    pthread_once(&nccl_once, load_nccl);
    if (!nccl_api_table) return fs_errorf(FS_ERR_USAGE, "rank %d: NCCL: %s", fs_comm_rank(control), nccl_why);
    return nccl_api_table->init(control, dev, out);
}

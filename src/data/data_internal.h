/*
 * data_internal.h — what the data module's files share and nothing outside it calls.
 */
#ifndef FLATSHARD_DATA_INTERNAL_H
#define FLATSHARD_DATA_INTERNAL_H

#include "flatshard/core.h"

/* fsyncs the directory holding path, so that a rename into it is durable (tokenfile.c) */
fs_status fs_data_sync_parent_dir(const char *path);

#endif /* FLATSHARD_DATA_INTERNAL_H */

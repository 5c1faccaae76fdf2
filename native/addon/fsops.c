/*
 * Filesystem operations of the addon for the writable-layer store: quotas and
 * subvolumes. (Functions are added here by the disk-quota work; see daemon/host/native.ts.)
 */
#include "dsec_native.h"

int dsec_fs_init(napi_env env, napi_value exports) {
  (void)env;
  (void)exports;
  return 0;
}

/*
 * eBPF side of the addon: loading dsec's BPF objects, cgroup attachment and map access.
 * (Functions are added here by the egress-policy work; see daemon/host/native.ts.)
 */
#include "dsec_native.h"

int dsec_bpf_init(napi_env env, napi_value exports) {
  (void)env;
  (void)exports;
  return 0;
}

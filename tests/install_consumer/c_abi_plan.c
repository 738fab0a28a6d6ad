/* The installed C ABI from a C program: version, a config, a memory plan, and an error that
 * names its argument. */
#include <stdio.h>

#include "moeblaze/capi/c_api.h"

int main(void) {
  mb_layer_config cfg = {0};
  cfg.experts = 128;
  cfg.topk = 8;
  cfg.hidden = 2048;
  cfg.ffn = 768;
  cfg.activation = MB_SWIGLU;
  cfg.router = MB_ROUTER_SOFTMAX;
  cfg.renormalize = 1;
  cfg.route_scale = 1.0f;
  mb_memory_plan plan;
  if (mb_plan_memory(&cfg, 8192, MB_SAVE_H, &plan) != MB_OK) {
    fprintf(stderr, "mb_plan_memory: %s\n", mb_last_error());
    return 1;
  }
  /* The library and the installed header must agree on the ABI. */
  printf("version %s abi %s\n", mb_version(), mb_abi_version() == MB_ABI_VERSION ? "matches the header" : "differs");
  printf("saved_bytes %llu\n", (unsigned long long)plan.saved_bytes);
  cfg.topk = 0;
  if (mb_config_validate(&cfg) != MB_ERR_INVALID_ARGUMENT) return 1;
  printf("bad topk names '%s'\n", mb_last_error_argument());
  return 0;
}

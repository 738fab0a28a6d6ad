/* The installed C ABI from a C program: version, a config, a memory plan, and an error that
 * names its argument. */
#include <stdio.h>

#include "capi/c_api.h"

int main(void) {
  mb_layer_config cfg = {128, 8, 2048, 768, MB_SWIGLU, MB_ROUTER_SOFTMAX, 1, 1.0f};
  mb_memory_plan plan;
  if (mb_plan_memory(&cfg, 8192, MB_SAVE_H, &plan) != MB_OK) {
    fprintf(stderr, "mb_plan_memory: %s\n", mb_last_error());
    return 1;
  }
  printf("version %s abi %d\n", mb_version(), mb_abi_version());
  printf("saved_bytes %llu\n", (unsigned long long)plan.saved_bytes);
  cfg.topk = 0;
  if (mb_config_validate(&cfg) != MB_ERR_INVALID_ARGUMENT) return 1;
  printf("bad topk names '%s'\n", mb_last_error_argument());
  return 0;
}

// Hooks of the stand-in driver (fake_gpu_driver.cpp): the test records each call through them.
#pragma once

extern "C" {

struct FakeDriverHooks {
  int (*load)(void **module, const void *image);
  int (*get_function)(void **function, void *module, const char *name);
  int (*set_attribute)(void *function, int attribute, int value);  // CUDA flavour only
  int (*launch)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, unsigned shared, void *stream, void **params, void **extra);
};

void fake_driver_set_hooks(const FakeDriverHooks *hooks);

}  // extern "C"

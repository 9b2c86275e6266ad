# tests/fakecuda/fakecuda.mk - a fake libcuda.so.1 for CI (no GPU there).
#
# $(BUILD)/fakecuda/libcuda.so.1 implements the driver entry points of
# daemon/driver/cuda_api.h on the host (tests/fakecuda/libcuda.c), so that
# tests/integration/fake_cuda.sh can run `gpucmdd --backend cuda` with
# LD_LIBRARY_PATH=$(BUILD)/fakecuda.  It needs no CUDA toolkit: the types
# and prototypes come from cuda_api.h, as for the backend itself.  Never
# install it: on a machine with a GPU it would hide the real driver.

FAKECUDA_LIB := $(BUILD)/fakecuda/libcuda.so.1

$(FAKECUDA_LIB): tests/fakecuda/libcuda.c daemon/driver/cuda_api.h
	$(call msg,LD,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -MF $(BUILD)/fakecuda/libcuda.d -shared \
		-Wl,-soname,libcuda.so.1 $(ALL_LDFLAGS) -o $@ $< -lpthread

# The same fake as a driver older than CUDA 12.4 (Debian bookworm's 535 is
# 12.2): no cuFuncGetParamInfo, so the backend checks a launch's arguments
# against what the module image declares (tests/integration/fake_cuda.sh).
FAKECUDA_OLD_LIB := $(BUILD)/fakecuda/cuda-12.2/libcuda.so.1

$(FAKECUDA_OLD_LIB): tests/fakecuda/libcuda.c daemon/driver/cuda_api.h
	$(call msg,LD,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -DFAKECUDA_NO_PARAM_INFO \
		-MF $(BUILD)/fakecuda/cuda-12.2/libcuda.d -shared \
		-Wl,-soname,libcuda.so.1 $(ALL_LDFLAGS) -o $@ $< -lpthread

.PHONY: fakecuda
fakecuda: $(FAKECUDA_LIB) $(FAKECUDA_OLD_LIB)

tests: $(FAKECUDA_LIB) $(FAKECUDA_OLD_LIB)

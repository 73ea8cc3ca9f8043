/* Stubs for the 16 NCCL entry points that torch 2.14 (built with NCCL 2.30.7) links but NCCL 2.27.7 lacks;
   the H200 image has NCCL 2.28.9 (torch 2.11 pin), whose missing ones (first: ncclCommResume) fail torch import.
   Preloaded with LD_PRELOAD. TP=1 never calls them; each returns ncclInvalidUsage (5).
   Build: gcc -O2 -shared -fPIC -o libnccl_shim.so nccl_shim.c */
int ncclAlltoAll(void) { return 5; }
int ncclCommGetUniqueId(void) { return 5; }
int ncclCommGrow(void) { return 5; }
int ncclCommMemStats(void) { return 5; }
int ncclCommResume(void) { return 5; }
int ncclCommRevoke(void) { return 5; }
int ncclCommSuspend(void) { return 5; }
int ncclDevCommCreate(void) { return 5; }
int ncclDevCommDestroy(void) { return 5; }
int ncclGather(void) { return 5; }
int ncclGetLsaMultimemDevicePointer(void) { return 5; }
int ncclGetPeerDevicePointer(void) { return 5; }
int ncclPutSignal(void) { return 5; }
int ncclSignal(void) { return 5; }
int ncclWaitSignal(void) { return 5; }
int ncclWinGetUserPtr(void) { return 5; }

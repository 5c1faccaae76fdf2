{
  "targets": [
    {
      "target_name": "dsec_native",
      "sources": ["dsec_native.c", "bpf.c", "fsops.c", "builder.c", "spawn.c", "overlay.c"],
      "cflags": ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-O2"],
      "defines": ["NAPI_VERSION=8"],
      "libraries": ["-lbpf"]
    }
  ]
}

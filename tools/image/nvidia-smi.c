/* The lab's stand-in for nvidia-smi. On a GPU node the NVIDIA container toolkit puts
 * the driver's nvidia-smi into a container given a GPU; the lab's real node has no GPU,
 * no driver and no toolkit, so the image docs/examples/gpu-pod.yaml names is this one
 * under that name (lab/realnode.py), and the example runs there as written. It says
 * what it is and which GPUs the container was given (NVIDIA_VISIBLE_DEVICES: unset in
 * the lab, where nothing assigns devices), then exits 0. Built static. */
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
    printf("nvidia-smi: the gpu-scheduler lab's stand-in (no NVIDIA driver on this node)\n");
    printf("NVIDIA_VISIBLE_DEVICES=%s\n", visible ? visible : "(unset)");
    return 0;
}

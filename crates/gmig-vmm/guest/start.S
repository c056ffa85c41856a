/* Entry: the VMM starts the vCPU in 64-bit long mode at 1 MiB with the stack just below it. */
    .section .text.start, "ax"
    .globl _start
_start:
    cld
    call guest_main
1:  hlt
    jmp 1b
    .section .note.GNU-stack, "", @progbits

/*
 * Entry of the guest GPU driver booted by cloud-hypervisor (`--kernel`), through the PVH boot
 * protocol: a Xen ELF note (type 18, XEN_ELFNOTE_PHYS32_ENTRY) gives the 32-bit entry, which the
 * VMM starts in 32-bit protected mode with paging off, flat segments and %ebx pointing at the
 * hvm_start_info structure. The stub zeroes .bss, turns on long mode with the page tables below
 * (0-4 GiB identity-mapped with 2 MiB pages; pvh.c maps the BARs it finds) and calls
 * pvh_main(start_info) on a stack of its own.
 */
    .section .note.Xen, "a", @note
    .balign 4
    .long 4             /* namesz */
    .long 4             /* descsz */
    .long 18            /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long pvh_start

    .section .text.start, "ax"
    .code32
    .globl pvh_start
pvh_start:
    cli
    cld
    mov %ebx, %esi                  /* hvm_start_info, kept for pvh_main */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    xor %eax, %eax
    rep stosb
    mov %cr4, %eax
    or $0x20, %eax                  /* PAE */
    mov %eax, %cr4
    mov $pvh_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx           /* EFER */
    rdmsr
    or $0x100, %eax                 /* LME */
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax            /* PG | PE */
    mov %eax, %cr0
    lgdt pvh_gdt_ptr
    ljmp $0x08, $1f
    .code64
1:  mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    mov $pvh_stack_top, %rsp
    mov %esi, %edi                  /* pvh_main(start_info) */
    call pvh_main
2:  hlt
    jmp 2b

    .section .data
    .balign 8
pvh_gdt:
    .quad 0
    .quad 0x00af9b000000ffff        /* 0x08: 64-bit code */
    .quad 0x00cf93000000ffff        /* 0x10: data */
pvh_gdt_end:
pvh_gdt_ptr:
    .word pvh_gdt_end - pvh_gdt - 1
    .quad pvh_gdt

    .balign 4096
    .globl pvh_pml4, pvh_pdpt0
pvh_pml4:
    .quad pvh_pdpt0 + 3
    .fill 511, 8, 0
pvh_pdpt0:
    .quad pvh_pd + 0x0003
    .quad pvh_pd + 0x1003
    .quad pvh_pd + 0x2003
    .quad pvh_pd + 0x3003
    .fill 508, 8, 0
pvh_pd:                             /* 2048 entries: 0-4 GiB, 2 MiB pages, present | write | PS */
    .set addr, 0
    .rept 2048
    .quad addr + 0x83
    .set addr, addr + 0x200000
    .endr

    .section .bss
    .balign 16
pvh_stack:
    .skip 65536
pvh_stack_top:

    .section .note.GNU-stack, "", @progbits

/* The switch between fibers on x86-64 (see src/fiber.c): the callee-saved
 * registers, MXCSR and the x87 control word are pushed on the stack being
 * left, its stack pointer stored in *from (%rdi), the stack pointer in *to
 * (%rsi) loaded and that stack's registers popped; ret then goes on where
 * the other side left off (or, the first time, at the fiber's entry).
 *
 * void fiber_switch_asm(fctx *from, const fctx *to);
 *
 * Control-flow protection (-fcf-protection): the function starts with
 * endbr64, so it may be reached by an indirect call under IBT. Shadow
 * stacks (SHSTK) are not claimed: the ret below returns into another stack
 * than the call came from, which a shadow stack would refuse unless each
 * fiber had a shadow stack of its own, switched here as well (rstorssp).
 * The property note below marks this object IBT only, so a binary linked
 * from it never runs with shadow stacks enabled. */
#if defined(__x86_64__) && defined(__ELF__)

	.text
	.globl	fiber_switch_asm
	.hidden	fiber_switch_asm
	.type	fiber_switch_asm, @function
	.p2align 4
fiber_switch_asm:
#if defined(__CET__) && (__CET__ & 1)
	endbr64
#endif
	pushq	%rbp
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	subq	$8, %rsp
	stmxcsr	(%rsp)
	fnstcw	4(%rsp)
	movq	%rsp, (%rdi)
	movq	(%rsi), %rsp
	ldmxcsr	(%rsp)
	fldcw	4(%rsp)
	addq	$8, %rsp
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	ret
	.size	fiber_switch_asm, .-fiber_switch_asm

#if defined(__CET__) && (__CET__ & 1)
/* NT_GNU_PROPERTY_TYPE_0 with GNU_PROPERTY_X86_FEATURE_1_AND = IBT. */
	.section .note.gnu.property, "a"
	.p2align 3
	.long	4		/* name size: "GNU\0" */
	.long	16		/* descriptor size */
	.long	5		/* NT_GNU_PROPERTY_TYPE_0 */
	.asciz	"GNU"
	.long	0xc0000002	/* GNU_PROPERTY_X86_FEATURE_1_AND */
	.long	4		/* its size */
	.long	1		/* GNU_PROPERTY_X86_FEATURE_1_IBT */
	.p2align 3
#endif

#endif

/* No executable stack wanted. */
#if defined(__ELF__)
	.section .note.GNU-stack, "", @progbits
#endif

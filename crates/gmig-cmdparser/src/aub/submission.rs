//! Execlist submissions found in a capture, and the capture memory they read through.

use super::consts::{ctx, DESCRIPTOR_LRCA_MASK, PAGE_SIZE, PTE_ADDRESS_MASK};
use super::error::MemFault;
use super::image::MemoryImage;
use crate::{AddressSpace, Engine, GgttOffset, GpuMemory, GpuMemoryMut, MemoryError, RingSpan};

// ------------------------------------------------------------------------------------------------
// Submissions
// ------------------------------------------------------------------------------------------------

/// The ring a submitted context runs, as its context image gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingState {
    /// GGTT offset of the ring buffer (`RING_START`).
    pub start: GgttOffset,
    /// Size of the ring in bytes (from `RING_CTL`).
    pub size: u64,
    /// Head offset in bytes (`RING_HEAD`).
    pub head: u64,
    /// Tail offset in bytes (`RING_TAIL`).
    pub tail: u64,
}

/// One execlist submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Submission {
    /// Engine the context was submitted to.
    pub engine: Engine,
    /// The context descriptor written to the execlist port.
    pub descriptor: u64,
    /// GGTT offset of the logical ring context (PPHWSP page, then the context image).
    pub lrca: GgttOffset,
    /// The ring, as the context image gave it at submission time.
    pub ring: RingState,
    /// Physical address of the PPGTT's PML4 (from the context image's `PDP0`).
    pub pml4: u64,
}

impl Submission {
    /// GGTT offset of the context image's register state (one page after the LRCA).
    #[must_use]
    pub fn context_image(&self) -> GgttOffset {
        GgttOffset(self.lrca.0 + PAGE_SIZE)
    }
}

impl Submission {
    /// The ring as the walker takes it.
    #[must_use]
    pub fn ring_span(&self) -> RingSpan {
        RingSpan {
            start: self.ring.start,
            size: self.ring.size,
            head: self.ring.head,
            tail: self.ring.tail,
        }
    }

    /// The memory this submission's commands see: the image through the GGTT, and through the
    /// PPGTT rooted at this submission's PML4.
    #[must_use]
    pub fn memory<'a>(&self, image: &'a MemoryImage) -> CaptureMemory<'a> {
        CaptureMemory {
            image,
            pml4: self.pml4,
        }
    }
}

/// A [`MemoryImage`] seen through the GGTT and one PPGTT, as the walker reads it.
#[derive(Clone, Copy, Debug)]
pub struct CaptureMemory<'a> {
    /// The image.
    pub image: &'a MemoryImage,
    /// Physical address of the PPGTT's PML4.
    pub pml4: u64,
}

/// A mutable [`MemoryImage`] seen through the GGTT and one PPGTT (for remapping in place).
#[derive(Debug)]
pub struct CaptureMemoryMut<'a> {
    /// The image.
    pub image: &'a mut MemoryImage,
    /// Physical address of the PPGTT's PML4.
    pub pml4: u64,
}

fn memory_error(space: AddressSpace, fault: MemFault) -> MemoryError {
    match fault {
        MemFault::GgttOutOfRange { addr }
        | MemFault::GgttUnmapped { addr }
        | MemFault::PpgttUnmapped { addr, .. }
        | MemFault::BadContextAddress { addr } => MemoryError::Unmapped { space, addr },
        MemFault::Overflow { addr, len } => MemoryError::Overflow {
            space,
            addr,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        },
        MemFault::PageLimit { .. } => MemoryError::Denied { space, addr: 0 },
    }
}

fn image_read(
    image: &MemoryImage,
    pml4: u64,
    space: AddressSpace,
    addr: u64,
    out: &mut [u8],
) -> std::result::Result<(), MemoryError> {
    match space {
        AddressSpace::Ggtt => image.read_ggtt(GgttOffset(addr), out),
        AddressSpace::Ppgtt => image.read_ppgtt(pml4, addr, out),
    }
    .map_err(|f| memory_error(space, f))
}

impl GpuMemory for CaptureMemory<'_> {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        image_read(self.image, self.pml4, space, addr, out)
    }
}

impl GpuMemory for CaptureMemoryMut<'_> {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        image_read(self.image, self.pml4, space, addr, out)
    }
}

impl GpuMemoryMut for CaptureMemoryMut<'_> {
    fn write(
        &mut self,
        space: AddressSpace,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        match space {
            AddressSpace::Ggtt => self.image.write_ggtt(GgttOffset(addr), data, u64::MAX),
            AddressSpace::Ppgtt => self.image.write_ppgtt(self.pml4, addr, data, u64::MAX),
        }
        .map_err(|f| memory_error(space, f))
    }
}

pub(crate) fn submission_from_image(
    image: &MemoryImage,
    engine: Engine,
    descriptor: u64,
) -> std::result::Result<Submission, MemFault> {
    let lrca = GgttOffset(descriptor & DESCRIPTOR_LRCA_MASK);
    let c = image.read_ggtt_dwords(GgttOffset(lrca.0 + PAGE_SIZE), ctx::PDP0_LDW + 1)?;
    let at = |i: usize| u64::from(c.get(i).copied().unwrap_or(0));
    Ok(Submission {
        engine,
        descriptor,
        lrca,
        ring: RingState {
            start: GgttOffset(at(ctx::RING_START) & 0xffff_f000),
            size: (at(ctx::RING_CTL) & 0x1f_f000) + PAGE_SIZE,
            head: at(ctx::RING_HEAD) & 0x1f_fffc,
            tail: at(ctx::RING_TAIL) & 0x1f_fff8,
        },
        pml4: ((at(ctx::PDP0_UDW) << 32) | at(ctx::PDP0_LDW)) & PTE_ADDRESS_MASK,
    })
}

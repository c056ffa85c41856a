//! What each command is to the indirect state: state it records, work it derives a footprint
//! for, or neither.

use super::stage::Stage;
use crate::desc::Flags;

/// What [`IndirectState::observe`] records from a state command.
///
/// [`IndirectState::observe`]: super::IndirectState::observe
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Obs {
    StateBaseAddress,
    BindingTablePool,
    BindingTable(Stage),
    /// 3DSTATE_VS, 3DSTATE_DS or 3DSTATE_GS.
    Shader(Stage),
    Hull,
    Pixel,
    Depth,
    Stencil,
    HierDepth,
    StreamOut,
    SoBuffer,
    /// Media pipe state: scratch (reached only through kernels' scratch messages), CURBE and
    /// gateway state write nothing.
    MediaWritesNothing,
    InterfaceDescriptors,
    MfxSurface,
    MfxPipeBuffers,
    MfxBspBuffers,
    MfxIndirectObjects,
}

/// The state commands [`IndirectState::observe`] records, and what it records of each.
///
/// [`IndirectState::observe`]: super::IndirectState::observe
pub(super) const OBSERVED: &[(&str, Obs)] = &[
    ("STATE_BASE_ADDRESS", Obs::StateBaseAddress),
    ("3DSTATE_BINDING_TABLE_POOL_ALLOC", Obs::BindingTablePool),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_VS",
        Obs::BindingTable(Stage::Vs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_HS",
        Obs::BindingTable(Stage::Hs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_DS",
        Obs::BindingTable(Stage::Ds),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_GS",
        Obs::BindingTable(Stage::Gs),
    ),
    (
        "3DSTATE_BINDING_TABLE_POINTERS_PS",
        Obs::BindingTable(Stage::Ps),
    ),
    ("3DSTATE_VS", Obs::Shader(Stage::Vs)),
    ("3DSTATE_HS", Obs::Hull),
    ("3DSTATE_DS", Obs::Shader(Stage::Ds)),
    ("3DSTATE_GS", Obs::Shader(Stage::Gs)),
    ("3DSTATE_PS", Obs::Pixel),
    ("3DSTATE_DEPTH_BUFFER", Obs::Depth),
    ("3DSTATE_STENCIL_BUFFER", Obs::Stencil),
    ("3DSTATE_HIER_DEPTH_BUFFER", Obs::HierDepth),
    ("3DSTATE_STREAMOUT", Obs::StreamOut),
    ("3DSTATE_SO_BUFFER", Obs::SoBuffer),
    ("MEDIA_VFE_STATE", Obs::MediaWritesNothing),
    ("MEDIA_CURBE_LOAD", Obs::MediaWritesNothing),
    ("MEDIA_GATEWAY_STATE", Obs::MediaWritesNothing),
    ("MEDIA_STATE_FLUSH", Obs::MediaWritesNothing),
    ("MEDIA_POOL_STATE", Obs::MediaWritesNothing),
    ("MEDIA_INTERFACE_DESCRIPTOR_LOAD", Obs::InterfaceDescriptors),
    ("MFX_SURFACE_STATE", Obs::MfxSurface),
    ("MFX_PIPE_BUF_ADDR_STATE", Obs::MfxPipeBuffers),
    ("MFX_BSP_BUF_BASE_ADDR_STATE", Obs::MfxBspBuffers),
    ("MFX_IND_OBJ_BASE_ADDR_STATE", Obs::MfxIndirectObjects),
];

/// The kinds of work command a footprint is derived for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// 3DPRIMITIVE.
    Draw,
    /// 3DSTATE_WM_HZ_OP.
    DepthOp,
    /// GPGPU_WALKER and the MEDIA_OBJECT family.
    Dispatch,
    /// MFD_*_BSD_OBJECT.
    Decode,
    /// Work whose write targets are not modelled.
    Unmodelled,
}

/// What a command is to the indirect state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// State [`IndirectState::observe`] records.
    ///
    /// [`IndirectState::observe`]: super::IndirectState::observe
    Named(Obs),
    /// A work command (it has a footprint).
    Work(Work),
    /// Anything else.
    Plain,
    /// A [`Role::Plain`] row that changes nothing here and writes no memory ([`inert`]).
    Inert,
}

pub(super) fn role_of_name(name: &str) -> Role {
    if let Some(work) = work_of_name(name) {
        Role::Work(work)
    } else if let Some((_, obs)) = OBSERVED.iter().find(|(n, _)| *n == name) {
        Role::Named(*obs)
    } else {
        Role::Plain
    }
}

/// The role of a row: that of its name, and [`Role::Inert`] for a plain row that is [`inert`].
pub(super) fn role_of_row(desc: &crate::desc::CommandDesc) -> Role {
    match role_of_name(desc.name) {
        Role::Plain if inert(desc) => Role::Inert,
        r => r,
    }
}

/// The role of a table row, computed once per row (commands are stepped by the million).
#[inline]
pub(super) fn role(desc: &'static crate::desc::CommandDesc) -> Role {
    static ROLES: std::sync::OnceLock<Vec<Role>> = std::sync::OnceLock::new();
    let all = crate::rows::COMMANDS;
    let roles = ROLES.get_or_init(|| all.iter().map(role_of_row).collect());
    let index = (desc as *const crate::desc::CommandDesc as usize)
        .wrapping_sub(all.as_ptr() as usize)
        / std::mem::size_of::<crate::desc::CommandDesc>().max(1);
    match (all.get(index), roles.get(index)) {
        (Some(row), Some(r)) if std::ptr::eq(row, desc) => *r,
        // A row from elsewhere (never, with the crate's tables): decide by name.
        _ => role_of_row(desc),
    }
}

/// Whether stepping a command of row `desc` through the indirect state records nothing, whatever
/// its dwords ([`IndirectState::advance`] returns `None` without touching the state): an inert row,
/// a plain row outside the video classes, or media pipe state that writes nothing.
///
/// [`IndirectState::advance`]: super::IndirectState::advance
pub(crate) fn records_nothing(desc: &crate::desc::CommandDesc) -> bool {
    use crate::desc::Class;
    match role_of_row(desc) {
        Role::Inert | Role::Named(Obs::MediaWritesNothing) => true,
        Role::Plain => !matches!(desc.class, Class::Mfx | Class::Vebox),
        Role::Named(_) | Role::Work(_) => false,
    }
}

/// The state commands whose recording can change the surface states a draw or a dispatch
/// reads: those that set a field of a [`SurfaceKey`](super::SurfaceKey) (the heaps, the
/// binding-table pool and pointers, the shader stages, the interface descriptors). Depth,
/// stencil, HiZ, stream-output and video state bound other surfaces, never a surface state.
pub(super) const SURFACE_OBS: [Obs; 13] = [
    Obs::StateBaseAddress,
    Obs::BindingTablePool,
    Obs::BindingTable(Stage::Vs),
    Obs::BindingTable(Stage::Hs),
    Obs::BindingTable(Stage::Ds),
    Obs::BindingTable(Stage::Gs),
    Obs::BindingTable(Stage::Ps),
    Obs::Shader(Stage::Vs),
    Obs::Shader(Stage::Ds),
    Obs::Shader(Stage::Gs),
    Obs::Hull,
    Obs::Pixel,
    Obs::InterfaceDescriptors,
];

/// A row's *surface code* (5 bits, kept in the opcode index): what stepping a command of it
/// means to the surface states privileged work reads ([`IndirectState::advance_surfaces`]).
/// [`SURFACE_SKIP`]: nothing (the row records nothing those surface states depend on, and is
/// no draw or dispatch); [`SURFACE_DRAW`], [`SURFACE_DISPATCH`]: work with surface states;
/// from [`SURFACE_OBS_FIRST`] on: state of [`SURFACE_OBS`] to record.
///
/// [`IndirectState::advance_surfaces`]: super::IndirectState::advance_surfaces
pub(crate) fn surface_code(desc: &crate::desc::CommandDesc) -> u8 {
    match role_of_row(desc) {
        Role::Work(Work::Draw) => SURFACE_DRAW,
        Role::Work(Work::Dispatch) => SURFACE_DISPATCH,
        Role::Named(obs) => SURFACE_OBS
            .iter()
            .position(|o| *o == obs)
            .and_then(|i| u8::try_from(i).ok())
            .map_or(SURFACE_SKIP, |i| SURFACE_OBS_FIRST + i),
        Role::Work(_) | Role::Plain | Role::Inert => SURFACE_SKIP,
    }
}

/// [`surface_code`]: nothing to step.
pub(crate) const SURFACE_SKIP: u8 = 0;
/// [`surface_code`]: a draw (3DPRIMITIVE).
pub(crate) const SURFACE_DRAW: u8 = 1;
/// [`surface_code`]: a dispatch (GPGPU_WALKER, the MEDIA_OBJECT family).
pub(crate) const SURFACE_DISPATCH: u8 = 2;
/// [`surface_code`]: the first code of a [`SURFACE_OBS`] entry.
pub(super) const SURFACE_OBS_FIRST: u8 = 3;
/// Not a [`surface_code`]: the row is not known (a command met outside the walk's in-page
/// loop); its step takes the general way ([`IndirectState::advance`]).
///
/// [`IndirectState::advance`]: super::IndirectState::advance
pub(crate) const SURFACE_UNKNOWN: u8 = 31;

/// Video state commands that name no buffer the decoder writes.
pub(super) const MFX_STATE_WITHOUT_BUFFERS: &[&str] = &[
    "MFX_WAIT",
    "MFX_PIPE_MODE_SELECT",
    "MFX_STATE_POINTER",
    "MFX_QM_STATE",
    "MFX_FQM_STATE",
    "MFX_AVC_IMG_STATE",
    "MFX_AVC_QM_STATE",
    "MFX_AVC_SLICE_STATE",
    "MFX_AVC_REF_IDX_STATE",
    "MFX_AVC_WEIGHTOFFSET_STATE",
    "MFD_AVC_PICID_STATE",
    "MFD_AVC_DPB_STATE",
    "MFD_AVC_SLICEADDR",
    "MFX_MPEG2_PIC_STATE",
    "MFX_MPEG2_QM_STATE",
    "MFX_JPEG_PIC_STATE",
    "MFX_JPEG_HUFF_TABLE_STATE",
];

/// Whether a [`Role::Plain`] row changes nothing here and writes no memory: no written address
/// field, no unbounded writes, and not video state (which [`IndirectState::observe_plain`]
/// records). Its step is `(Nothing, None)` whatever its dwords.
///
/// [`IndirectState::observe_plain`]: super::IndirectState::observe_plain
#[inline]
pub(super) fn inert(desc: &crate::desc::CommandDesc) -> bool {
    use crate::desc::Class;
    let f = desc.flags;
    !matches!(desc.class, Class::Mfx | Class::Vebox)
        && !desc.addrs.iter().any(|a| a.access.writes())
        && !f.has(Flags::UNBOUNDED_WRITES)
        && !f.has(Flags::OPAQUE)
}

/// The kind of work a command makes the GPU do through indirect state; `None` for a command that
/// is not work.
fn work_of_name(name: &str) -> Option<Work> {
    Some(match name {
        "3DPRIMITIVE" => Work::Draw,
        "3DSTATE_WM_HZ_OP" => Work::DepthOp,
        "GPGPU_WALKER"
        | "MEDIA_OBJECT"
        | "MEDIA_OBJECT_WALKER"
        | "MEDIA_OBJECT_PRT"
        | "MEDIA_OBJECT_GRPID" => Work::Dispatch,
        _ if name.starts_with("MFD_") && name.ends_with("_BSD_OBJECT") => Work::Decode,
        "MFD_IT_OBJECT"
        | "MFX_DBK_OBJECT"
        | "MFX_PAK_INSERT_OBJECT"
        | "MFX_STITCH_OBJECT"
        | "HCP_BSD_OBJECT"
        | "HCP_PAK_OBJECT"
        | "HCP_PAK_INSERT_OBJECT"
        | "HCP_VP9_PAK_OBJECT"
        | "HUC_START"
        | "HUC_STREAM_OBJECT"
        | "VDENC_WALKER_STATE"
        | "SFC_FRAME_START"
        | "VEB_DI_IECP"
        | "MFX_VP8_PAK_OBJECT" => Work::Unmodelled,
        _ if name.starts_with("MFC_") && name.ends_with("_PAK_OBJECT") => Work::Unmodelled,
        _ => return None,
    })
}

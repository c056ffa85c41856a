//! Consistency of the command tables, and coverage of GVT-g's command list.

use std::collections::BTreeMap;

use gmig_cmdparser::{all_commands, by_name, lookup, Class, Engine, Gen, LengthRule};

/// Every command GVT-g's `gvt/cmd_parser.c` knows (its names; ours in parentheses where they
/// differ). Each must have a row.
const GVT: &[&str] = &[
    "MI_NOOP",
    "MI_SET_PREDICATE",
    "MI_USER_INTERRUPT",
    "MI_WAIT_FOR_EVENT",
    "MI_FLUSH",
    "MI_ARB_CHECK",
    "MI_RS_CONTROL",
    "MI_REPORT_HEAD",
    "MI_ARB_ON_OFF",
    "MI_URB_ATOMIC_ALLOC",
    "MI_BATCH_BUFFER_END",
    "MI_SUSPEND_FLUSH",
    "MI_PREDICATE",
    "MI_TOPOLOGY_FILTER",
    "MI_SET_APPID",
    "MI_RS_CONTEXT",
    "MI_DISPLAY_FLIP",
    "MI_SEMAPHORE_MBOX",
    "MI_MATH",
    "MI_URB_CLEAR",
    "MI_SEMAPHORE_SIGNAL",
    "MI_SEMAPHORE_WAIT",
    "MI_STORE_DATA_IMM",
    "MI_STORE_DATA_INDEX",
    "MI_LOAD_REGISTER_IMM",
    "MI_UPDATE_GTT",
    "MI_STORE_REGISTER_MEM",
    "MI_FLUSH_DW",
    "MI_CLFLUSH",
    "MI_REPORT_PERF_COUNT",
    "MI_LOAD_REGISTER_MEM",
    "MI_LOAD_REGISTER_REG",
    "MI_RS_STORE_DATA_IMM",
    "MI_LOAD_URB_MEM",
    "MI_STORE_URB_MEM", // GVT: MI_STORE_URM_MEM
    "MI_COPY_MEM_MEM",  // GVT: MI_OP_2E
    "MI_ATOMIC",        // GVT: MI_OP_2F
    "MI_BATCH_BUFFER_START",
    "MI_CONDITIONAL_BATCH_BUFFER_END",
    "MI_LOAD_SCAN_LINES_INCL",
    "XY_SETUP_BLT",
    "XY_SETUP_CLIP_BLT",
    "XY_SETUP_MONO_PATTERN_SL_BLT",
    "XY_PIXEL_BLT",
    "XY_SCANLINES_BLT",
    "XY_TEXT_BLT",
    "XY_TEXT_IMMEDIATE_BLT",
    "XY_COLOR_BLT",
    "XY_PAT_BLT",
    "XY_MONO_PAT_BLT",
    "XY_SRC_COPY_BLT",
    "XY_MONO_SRC_COPY_BLT",
    "XY_FULL_BLT",
    "XY_FULL_MONO_SRC_BLT",
    "XY_FULL_MONO_PATTERN_BLT",
    "XY_FULL_MONO_PATTERN_MONO_SRC_BLT",
    "XY_MONO_PAT_FIXED_BLT",
    "XY_MONO_SRC_COPY_IMMEDIATE_BLT",
    "XY_PAT_BLT_IMMEDIATE",
    "XY_SRC_COPY_CHROMA_BLT",
    "XY_FULL_IMMEDIATE_PATTERN_BLT",
    "XY_FULL_MONO_SRC_IMMEDIATE_PATTERN_BLT",
    "XY_PAT_CHROMA_BLT",
    "XY_PAT_CHROMA_BLT_IMMEDIATE",
    "3DSTATE_VIEWPORT_STATE_POINTERS_SF_CLIP",
    "3DSTATE_VIEWPORT_STATE_POINTERS_CC",
    "3DSTATE_BLEND_STATE_POINTERS",
    "3DSTATE_DEPTH_STENCIL_STATE_POINTERS",
    "3DSTATE_BINDING_TABLE_POINTERS_VS",
    "3DSTATE_BINDING_TABLE_POINTERS_HS",
    "3DSTATE_BINDING_TABLE_POINTERS_DS",
    "3DSTATE_BINDING_TABLE_POINTERS_GS",
    "3DSTATE_BINDING_TABLE_POINTERS_PS",
    "3DSTATE_SAMPLER_STATE_POINTERS_VS",
    "3DSTATE_SAMPLER_STATE_POINTERS_HS",
    "3DSTATE_SAMPLER_STATE_POINTERS_DS",
    "3DSTATE_SAMPLER_STATE_POINTERS_GS",
    "3DSTATE_SAMPLER_STATE_POINTERS_PS",
    "3DSTATE_URB_VS",
    "3DSTATE_URB_HS",
    "3DSTATE_URB_DS",
    "3DSTATE_URB_GS",
    "3DSTATE_GATHER_CONSTANT_VS",
    "3DSTATE_GATHER_CONSTANT_GS",
    "3DSTATE_GATHER_CONSTANT_HS",
    "3DSTATE_GATHER_CONSTANT_DS",
    "3DSTATE_GATHER_CONSTANT_PS",
    "3DSTATE_DX9_CONSTANTF_VS",
    "3DSTATE_DX9_CONSTANTF_PS",
    "3DSTATE_DX9_CONSTANTI_VS",
    "3DSTATE_DX9_CONSTANTI_PS",
    "3DSTATE_DX9_CONSTANTB_VS",
    "3DSTATE_DX9_CONSTANTB_PS",
    "3DSTATE_DX9_LOCAL_VALID_VS",
    "3DSTATE_DX9_LOCAL_VALID_PS",
    "3DSTATE_DX9_GENERATE_ACTIVE_VS",
    "3DSTATE_DX9_GENERATE_ACTIVE_PS",
    "3DSTATE_BINDING_TABLE_EDIT_VS",
    "3DSTATE_BINDING_TABLE_EDIT_GS",
    "3DSTATE_BINDING_TABLE_EDIT_HS",
    "3DSTATE_BINDING_TABLE_EDIT_DS",
    "3DSTATE_BINDING_TABLE_EDIT_PS",
    "3DSTATE_VF_INSTANCING",
    "3DSTATE_VF_SGVS",
    "3DSTATE_VF_TOPOLOGY",
    "3DSTATE_WM_CHROMAKEY",
    "3DSTATE_PS_BLEND",
    "3DSTATE_WM_DEPTH_STENCIL",
    "3DSTATE_PS_EXTRA",
    "3DSTATE_RASTER",
    "3DSTATE_SBE_SWIZ",
    "3DSTATE_WM_HZ_OP",
    "3DSTATE_VERTEX_BUFFERS",
    "3DSTATE_VERTEX_ELEMENTS",
    "3DSTATE_INDEX_BUFFER",
    "3DSTATE_VF_STATISTICS_LEGACY", // GVT: 3DSTATE_VF_STATISTICS (3, 0, 0x0b)
    "3DSTATE_VF",
    "3DSTATE_CC_STATE_POINTERS",
    "3DSTATE_SCISSOR_STATE_POINTERS",
    "3DSTATE_GS",
    "3DSTATE_CLIP",
    "3DSTATE_WM",
    "3DSTATE_CONSTANT_GS",
    "3DSTATE_CONSTANT_PS",
    "3DSTATE_SAMPLE_MASK",
    "3DSTATE_CONSTANT_HS",
    "3DSTATE_CONSTANT_DS",
    "3DSTATE_HS",
    "3DSTATE_TE",
    "3DSTATE_DS",
    "3DSTATE_STREAMOUT",
    "3DSTATE_SBE",
    "3DSTATE_PS",
    "3DSTATE_DRAWING_RECTANGLE",
    "3DSTATE_SAMPLER_PALETTE_LOAD0",
    "3DSTATE_CHROMA_KEY",
    "3DSTATE_DEPTH_BUFFER",
    "3DSTATE_POLY_STIPPLE_OFFSET",
    "3DSTATE_POLY_STIPPLE_PATTERN",
    "3DSTATE_LINE_STIPPLE",
    "3DSTATE_AA_LINE_PARAMETERS", // GVT: 3DSTATE_AA_LINE_PARAMS
    "3DSTATE_GS_SVB_INDEX",
    "3DSTATE_SAMPLER_PALETTE_LOAD1",
    "3DSTATE_MULTISAMPLE",
    "3DSTATE_STENCIL_BUFFER",
    "3DSTATE_HIER_DEPTH_BUFFER",
    "3DSTATE_CLEAR_PARAMS",
    "3DSTATE_PUSH_CONSTANT_ALLOC_VS",
    "3DSTATE_PUSH_CONSTANT_ALLOC_HS",
    "3DSTATE_PUSH_CONSTANT_ALLOC_DS",
    "3DSTATE_PUSH_CONSTANT_ALLOC_GS",
    "3DSTATE_PUSH_CONSTANT_ALLOC_PS",
    "3DSTATE_MONOFILTER_SIZE",
    "3DSTATE_SO_DECL_LIST",
    "3DSTATE_SO_BUFFER",
    "3DSTATE_BINDING_TABLE_POOL_ALLOC",
    "3DSTATE_GATHER_POOL_ALLOC",
    "3DSTATE_DX9_CONSTANT_BUFFER_POOL_ALLOC",
    "3DSTATE_SAMPLE_PATTERN",
    "PIPE_CONTROL",
    "3DPRIMITIVE",
    "PIPELINE_SELECT",
    "STATE_PREFETCH",
    "STATE_SIP",
    "STATE_BASE_ADDRESS",
    "GPGPU_CSR_BASE_ADDRESS", // GVT: OP_3D_MEDIA_0_1_4
    "3DSTATE_VS",
    "3DSTATE_SF",
    "3DSTATE_CONSTANT_VS",
    "3DSTATE_VF_COMPONENT_PACKING", // GVT: 3DSTATE_COMPONENT_PACKING
    "MEDIA_INTERFACE_DESCRIPTOR_LOAD",
    "MEDIA_GATEWAY_STATE",
    "MEDIA_STATE_FLUSH",
    "MEDIA_POOL_STATE",
    "MEDIA_OBJECT",
    "MEDIA_CURBE_LOAD",
    "MEDIA_OBJECT_PRT",
    "MEDIA_OBJECT_WALKER",
    "GPGPU_WALKER",
    "MEDIA_VFE_STATE",
    "3DSTATE_VF_STATISTICS", // GVT: 3DSTATE_VF_STATISTICS_GM45
    "MFX_PIPE_MODE_SELECT",
    "MFX_SURFACE_STATE",
    "MFX_PIPE_BUF_ADDR_STATE",
    "MFX_IND_OBJ_BASE_ADDR_STATE",
    "MFX_BSP_BUF_BASE_ADDR_STATE",
    "MFX_2_0_0_5", // GVT: OP_2_0_0_5
    "MFX_STATE_POINTER",
    "MFX_QM_STATE",
    "MFX_FQM_STATE",
    "MFX_PAK_INSERT_OBJECT",
    "MFX_STITCH_OBJECT",
    "MFD_IT_OBJECT",
    "MFX_WAIT",
    "MFX_AVC_IMG_STATE",
    "MFX_AVC_QM_STATE",
    "MFX_AVC_DIRECTMODE_STATE",
    "MFX_AVC_SLICE_STATE",
    "MFX_AVC_REF_IDX_STATE",
    "MFX_AVC_WEIGHTOFFSET_STATE",
    "MFD_AVC_PICID_STATE",
    "MFD_AVC_DPB_STATE",
    "MFD_AVC_BSD_OBJECT",
    "MFD_AVC_SLICEADDR",
    "MFC_AVC_PAK_OBJECT",
    "MFX_VC1_PRED_PIPE_STATE",
    "MFX_VC1_DIRECTMODE_STATE",
    "MFD_VC1_SHORT_PIC_STATE",
    "MFD_VC1_LONG_PIC_STATE",
    "MFD_VC1_BSD_OBJECT",
    "MFC_MPEG2_SLICEGROUP_STATE",
    "MFC_MPEG2_PAK_OBJECT",
    "MFX_MPEG2_PIC_STATE",
    "MFX_MPEG2_QM_STATE",
    "MFD_MPEG2_BSD_OBJECT",
    "MFX_2_6_0_0",
    "MFX_2_6_0_9",
    "MFX_2_6_0_8",
    "MFX_JPEG_PIC_STATE",
    "MFX_JPEG_HUFF_TABLE_STATE",
    "MFD_JPEG_BSD_OBJECT",
    "VEBOX_STATE",
    "VEBOX_SURFACE_STATE",
    "VEB_DI_IECP",
];

/// Legacy blits the brief names beyond GVT-g's list.
const EXTRA_BLITS: &[&str] = &["XY_FAST_COPY_BLT"];

#[test]
fn every_gvt_command_and_legacy_blit_has_a_row() {
    assert!(GVT.len() >= 220, "GVT list has {} names", GVT.len());
    let missing: Vec<_> = GVT
        .iter()
        .chain(EXTRA_BLITS)
        .filter(|n| all_commands().iter().all(|d| d.name != **n))
        .collect();
    assert!(missing.is_empty(), "no row for {missing:?}");
    assert!(all_commands().len() >= 260, "{} rows", all_commands().len());
}

#[test]
fn rows_are_consistent_and_keys_unique_per_gen_and_engine() {
    for gen in Gen::ALL {
        for engine in Engine::ALL {
            let mut keys = BTreeMap::new();
            for d in all_commands().iter().filter(|d| d.available(gen, engine)) {
                let ok = matches!(
                    (d.class, engine),
                    (Class::Mi, _)
                        | (Class::Blit, Engine::Blitter)
                        | (Class::Render3d, Engine::Render)
                        | (Class::Mfx, Engine::Video)
                        | (Class::Vebox, Engine::VideoEnhance)
                );
                assert!(ok, "{} ({:?}) listed on {engine:?}", d.name, d.class);
                if let Some(prev) = keys.insert((d.class as u8, d.opcode), d.name) {
                    panic!(
                        "{gen:?} {engine:?}: {} and {} share an opcode",
                        prev, d.name
                    );
                }
                // The header a row builds must look the row up again.
                let len = d.exact_len.map_or(8, u32::from);
                let dw0 = d.header(len);
                let found = lookup(gen, engine, dw0).map(|x| x.name);
                assert_eq!(found, Some(d.name), "{gen:?} {engine:?} header 0x{dw0:08x}");
                if let Some(e) = d.exact_len {
                    assert_eq!(d.len_of(dw0), usize::from(e), "{}", d.name);
                }
                if let LengthRule::Variable { bits, bias } = d.length {
                    assert!(
                        (6..=16).contains(&bits) && (1..=2).contains(&bias),
                        "{}",
                        d.name
                    );
                }
                for a in d.addrs {
                    assert!(a.repeat != Some(0), "{}", d.name);
                    assert!(u32::from(a.lo) < a.width.top(), "{}", d.name);
                }
            }
        }
    }
}

#[test]
fn engines_see_only_their_command_types() {
    // A 2D command on render, a 3D command on the blitter: unknown.
    let xy = by_name(Gen::Gen9, Engine::Blitter, "XY_SRC_COPY_BLT").unwrap();
    assert!(lookup(Gen::Gen9, Engine::Render, xy.header(10)).is_none());
    let pc = by_name(Gen::Gen9, Engine::Render, "PIPE_CONTROL").unwrap();
    assert!(lookup(Gen::Gen9, Engine::Blitter, pc.header(6)).is_none());
    // The same type-3 opcode means different commands on video and render engines.
    let on_video = lookup(Gen::Gen9, Engine::Video, 0x7000_0000).map(|d| d.name);
    let on_render = lookup(Gen::Gen9, Engine::Render, 0x7000_0000).map(|d| d.name);
    assert_ne!(on_video, on_render);
    // XY_FAST_COPY_BLT is GEN9+.
    assert!(by_name(Gen::Gen8, Engine::Blitter, "XY_FAST_COPY_BLT").is_none());
    assert!(by_name(Gen::Gen11, Engine::Blitter, "XY_FAST_COPY_BLT").is_some());
}

#[test]
fn gen_and_engine_names_round_trip() {
    for g in Gen::ALL {
        assert_eq!(g.to_string().parse::<Gen>(), Ok(g));
    }
    for e in Engine::ALL {
        assert_eq!(e.to_string().parse::<Engine>(), Ok(e));
    }
    assert!("gen12".parse::<Gen>().is_err());
    assert_eq!("bcs".parse::<Engine>(), Ok(Engine::Blitter));
}

/// The index's packed length rule gives what the row's own rule gives, for every row on every
/// generation and engine it exists on, at every DWord Length value of its field.
#[test]
fn the_index_gives_each_commands_length_as_its_row_does() {
    let mut checked = 0u32;
    for gen in Gen::ALL {
        for engine in Engine::ALL {
            let table = gmig_cmdparser::table::Table::new(gen, engine);
            for d in all_commands() {
                let dw0 = d.header(0);
                let Some((row, _)) = table.lookup_len(dw0) else {
                    continue;
                };
                if !std::ptr::eq(row, d) {
                    continue;
                }
                let fields: Vec<u32> = match d.length {
                    LengthRule::Fixed(_) => vec![0, 0xff, 0xffff],
                    LengthRule::Variable { bits, .. } => {
                        let max = (1u32 << bits) - 1;
                        vec![0, 1, max / 2, max]
                    }
                };
                for f in fields {
                    let dw0 = dw0 | f;
                    let (r, len) = table.lookup_len(dw0).unwrap();
                    assert!(std::ptr::eq(r, d), "{}: {dw0:#x}", d.name);
                    assert_eq!(len, d.len_of(dw0), "{} {gen} {engine}: {dw0:#x}", d.name);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 1000, "only {checked} lengths checked");
}

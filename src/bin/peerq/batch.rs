//! `peerq batch show` and `peerq batch cancel`: a batch's record, and a
//! user's cancel of it (docs/design.md §19), through the library's
//! `Service`.

use peerq::admin::Admin;
use peerq::workflow::{BatchCancelled, BatchId, BatchView, CallbackState};

use crate::args::{BatchArgs, BatchCommand};
use crate::{failed, service};

/// `peerq batch …`.
pub(crate) async fn batch(admin: &Admin, command: BatchCommand) -> Result<String, String> {
    match command {
        BatchCommand::Show(args) => show(admin, args).await,
        BatchCommand::Cancel(args) => cancel(admin, args).await,
    }
}

async fn cancel(admin: &Admin, args: BatchArgs) -> Result<String, String> {
    let id: BatchId = args.id.parse().map_err(|e: peerq::Error| e.to_string())?;
    let service = service(admin, &args.named.name).await?;
    let done = service.cancel_batch(&id).await.map_err(failed)?;
    if !done.found {
        return Err(format!(
            "no batch {id} in service `{}` (never opened, or gone after its retention)",
            args.named.name
        ));
    }
    args.named.output.show(&done, || cancelled(&done))
}

/// The text form of a cancel: a line per field.
fn cancelled(done: &BatchCancelled) -> String {
    let state = if done.was_done {
        "was done: its callback was cancelled as a task"
    } else {
        "cancelled: no callback will come"
    };
    let subflows: Vec<&str> = done.subflows.iter().map(BatchId::as_str).collect();
    let rows = [
        ("id", done.id.to_string()),
        ("batch", state.to_owned()),
        ("cancelled", done.cancelled.to_string()),
        ("requested", done.requested.to_string()),
        ("final", done.already_final.to_string()),
        ("unknown", done.unknown.to_string()),
        ("subflows", subflows.join(" ")),
    ];
    rows.into_iter()
        .map(|(k, v)| format!("{k:<12} {v}\n"))
        .collect()
}

async fn show(admin: &Admin, args: BatchArgs) -> Result<String, String> {
    let id: BatchId = args.id.parse().map_err(|e: peerq::Error| e.to_string())?;
    let service = service(admin, &args.named.name).await?;
    let view = service.batch(&id).await.map_err(failed)?;
    let view = view.ok_or_else(|| {
        format!(
            "no batch {id} in service `{}` (never opened, or gone after its retention)",
            args.named.name
        )
    })?;
    args.named.output.show(&view, || shown(&view))
}

/// The text form: a line per field.
fn shown(view: &BatchView) -> String {
    let state = view.state();
    let callback = match view.callback {
        CallbackState::Enqueued => "enqueued",
        _ => "none",
    };
    let rows = [
        ("id", view.id.to_string()),
        ("state", state.to_owned()),
        ("total", view.total.to_string()),
        ("pending", view.pending.to_string()),
        ("succeeded", view.succeeded.to_string()),
        ("dead", view.dead.to_string()),
        ("cancelled", view.cancelled.to_string()),
        ("callback", callback.to_owned()),
        (
            "callback_id",
            view.callback_id.clone().unwrap_or_else(|| "-".into()),
        ),
    ];
    // A chain's step.
    let step = view.steps.zip(view.step);
    let step = step.map(|(steps, step)| ("step", format!("{step} of {steps}")));
    let rows = rows.into_iter().chain(step);
    rows.map(|(k, v)| format!("{k:<12} {v}\n")).collect()
}

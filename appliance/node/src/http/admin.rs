//! Key rotation: a namespace's data key, and the node's KEK.

use axum::extract::State;
use axum::Json;

use super::input::NsCall;
use super::state::AppState;
use crate::errors::ApiResult;

/// Makes a new data key current for the namespace (older records stay readable).
pub(crate) async fn rotate_key(
    NsCall { st, scoped, .. }: NsCall,
) -> ApiResult<Json<serde_json::Value>> {
    let key_id = st.engine.rotate_data_key(&scoped).await?;
    Ok(Json(
        serde_json::json!({ "namespace": scoped, "key_id": key_id }),
    ))
}

/// Re-reads the KEK file and, if it changed, re-wraps every data key under the new KEK.
pub(crate) async fn rotate_kek(State(st): State<AppState>) -> ApiResult<Json<serde_json::Value>> {
    let n = st.engine.rotate_kek().await?;
    Ok(Json(serde_json::json!({ "rewrapped": n })))
}

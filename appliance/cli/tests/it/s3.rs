//! The S3 door (`--s3-listen`) against the Rust `aws-sdk-s3` with its default settings
//! (which send `aws-chunked` bodies with trailing checksums for streams, and CRC32
//! checksums), path-style, with credentials made by `ctxpod token create --s3`.

use crate::common::{self, Node};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use std::path::Path;

/// S3 credentials made by `ctxpod token create --s3 --dir <dir>`: (access key id, secret).
fn s3_credentials(dir: &Path, id: &str, role: &str, tenant: Option<&str>) -> (String, String) {
    let text = crate::tls::token_create(dir, &["--s3"], id, role, tenant);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_string()
    };
    (
        field("aws_access_key_id = "),
        field("aws_secret_access_key = "),
    )
}

/// The node's S3 address.
fn s3_url(node: &Node) -> String {
    let a = std::fs::read_to_string(node.dir.join("ctxpod.s3.addr")).expect("the S3 address");
    format!("http://{}", a.trim())
}

/// An `aws-sdk-s3` client of the node with its default settings, path-style.
fn client(node: &Node, ak: &str, sk: &str) -> aws_sdk_s3::Client {
    aws_sdk_s3::Client::from_conf(client_config(node, ak, sk).build())
}

/// The configuration of [`client`], to build on.
fn client_config(node: &Node, ak: &str, sk: &str) -> aws_sdk_s3::config::Builder {
    aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(s3_url(node))
        .force_path_style(true)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(ak, sk, None, None, "ctxpod"))
}

/// A node with auth on and the S3 door, and S3 credentials of tenants `a` and `b`.
async fn node_with_s3_tokens(dir: &Path) -> (Node, [(String, String); 2]) {
    let tokens = dir.join("tokens");
    let a = s3_credentials(&tokens, "a-rw", "tenant-rw", Some("a"));
    let b = s3_credentials(&tokens, "b-rw", "tenant-rw", Some("b"));
    let (root, hash) = ctxpod_node::auth::new_token("root").expect("token");
    let toml = format!(
        "value_bytes_max = \"24MiB\"\n[auth]\ntokens_dir = \"{}\"\n[[auth.tokens]]\nid = \"root\"\nrole = \"admin\"\nhash = \"{hash}\"\n\
         [[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n",
        tokens.display()
    );
    let how = ctxpod_client::connect::Connect {
        token: Some(root.to_string()),
        tls: None,
        ..Default::default()
    };
    let n = Node::start_configured(
        &dir.join("n"),
        &["--capacity", "256MiB", "--s3-listen", "127.0.0.1:0"],
        &toml,
        how,
        false,
    )
    .await;
    (n, [a, b])
}

/// A PutObject of `body` under `key`, with the client's default settings.
async fn put(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    body: impl Into<ByteStream>,
) -> Result<
    aws_sdk_s3::operation::put_object::PutObjectOutput,
    aws_sdk_s3::error::SdkError<aws_sdk_s3::operation::put_object::PutObjectError>,
> {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(body.into())
        .send()
        .await
}

/// Creates bucket `name`, which must succeed.
async fn create_bucket(s3: &aws_sdk_s3::Client, name: &str) {
    s3.create_bucket()
        .bucket(name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create bucket {name}: {e:?}"));
}

/// A GetObject of `key`, of `range` (`bytes=…`) if one is given.
async fn get_object(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    range: Option<&str>,
) -> Result<
    aws_sdk_s3::operation::get_object::GetObjectOutput,
    aws_sdk_s3::error::SdkError<aws_sdk_s3::operation::get_object::GetObjectError>,
> {
    s3.get_object()
        .bucket(bucket)
        .key(key)
        .set_range(range.map(str::to_string))
        .send()
        .await
}

/// The body of a GetObject's answer, whole.
async fn body_of(got: aws_sdk_s3::operation::get_object::GetObjectOutput) -> bytes::Bytes {
    got.body.collect().await.expect("body").into_bytes()
}

/// The error code of a GetObject that fails.
async fn get_refused(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> String {
    let e = get_object(s3, bucket, key, None)
        .await
        .expect_err("refused");
    code(&e)
}

/// Checks that `bucket` holds no object: nothing was stored.
async fn assert_bucket_empty(s3: &aws_sdk_s3::Client, bucket: &str) {
    let listed = s3
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .expect("list");
    assert_eq!(listed.key_count(), Some(0), "nothing was stored");
}

fn code<E: aws_sdk_s3::error::ProvideErrorMetadata>(e: &E) -> String {
    e.code().unwrap_or("(none)").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_sdk_stores_and_reads_blocks_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), _]) = node_with_s3_tokens(dir.path()).await;
    let s3 = client(&node, &ak, &sk);
    create_bucket(&s3, "kvbm").await;
    s3.head_bucket()
        .bucket("kvbm")
        .send()
        .await
        .expect("head bucket");
    in_memory_bodies_round_trip(&s3).await;
    streamed_and_crc32c_bodies_are_stored(&s3, dir.path()).await;
    ranged_gets_answer_their_bytes(&s3).await;
    // HEAD for existence; misses are NoSuchKey / NotFound, a bucket nobody has NoSuchBucket.
    let e = s3
        .head_object()
        .bucket("kvbm")
        .key("nope")
        .send()
        .await
        .expect_err("miss");
    assert!(
        e.as_service_error().is_some_and(|e| e.is_not_found()),
        "{e:?}"
    );
    assert_eq!(get_refused(&s3, "kvbm", "nope").await, "NoSuchKey");
    assert_eq!(get_refused(&s3, "none", "k").await, "NoSuchBucket");
    listings_page_and_fold(&s3).await;
    deletes_of_one_and_many_keys(&s3).await;
}

/// KVBM's layout: keys of 16 hex digits; in-memory bodies (one signed payload, a CRC32
/// header) of 1 B to the 8 MiB block limit, each read back (GET and HEAD) with its ETag.
async fn in_memory_bodies_round_trip(s3: &aws_sdk_s3::Client) {
    let sizes = [1usize, 65_536, 1 << 20, 8 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        let data = common::block(i as u64, n);
        let key = format!("{:016x}", 0xa5a5_0000_u64 + i as u64);
        let stored = put(s3, "kvbm", &key, ByteStream::from(data.to_vec()))
            .await
            .unwrap_or_else(|e| panic!("put {n}: {e:?}"));
        let etag = stored.e_tag().expect("an ETag").to_string();
        let got = get_object(s3, "kvbm", &key, None).await.expect("get");
        assert_eq!(got.e_tag(), Some(etag.as_str()));
        assert_eq!(body_of(got).await, data, "{n} bytes back");
        let head = s3
            .head_object()
            .bucket("kvbm")
            .key(&key)
            .send()
            .await
            .expect("head");
        assert_eq!(head.content_length(), Some(n as i64));
        assert_eq!(head.e_tag(), Some(etag.as_str()));
    }
}

/// A streamed body of known size (aws-chunked, signed chunks, a trailing CRC32) reads back;
/// a put with a CRC32C, which the node checks itself, is stored.
async fn streamed_and_crc32c_bodies_are_stored(s3: &aws_sdk_s3::Client, dir: &Path) {
    let file = dir.join("block.bin");
    let data = common::block(77, 3 << 20);
    std::fs::write(&file, &data).expect("write");
    s3.put_object()
        .bucket("kvbm")
        .key("streamed")
        .body(ByteStream::from_path(&file).await.expect("from path"))
        .send()
        .await
        .expect("a chunked put");
    let got = get_object(s3, "kvbm", "streamed", None).await.expect("get");
    assert_eq!(body_of(got).await, data);
    // And with a CRC32C the node checks itself.
    s3.put_object()
        .bucket("kvbm")
        .key("crc32c")
        .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc32C)
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .expect("a put with a CRC32C");
}

/// Ranged GETs, as KVBM reads a layer's part of a block; one past the end is InvalidRange.
async fn ranged_gets_answer_their_bytes(s3: &aws_sdk_s3::Client) {
    let key = format!("{:016x}", 0xa5a5_0002_u64);
    let whole = common::block(2, 1 << 20);
    for (range, want) in [
        ("bytes=0-0", &whole[..1]),
        ("bytes=4096-8191", &whole[4096..8192]),
        ("bytes=1048000-", &whole[1_048_000..]),
        ("bytes=-100", &whole[whole.len() - 100..]),
    ] {
        let got = get_object(s3, "kvbm", &key, Some(range))
            .await
            .unwrap_or_else(|e| panic!("{range}: {e:?}"));
        assert_eq!(got.content_length(), Some(want.len() as i64), "{range}");
        assert_eq!(&body_of(got).await[..], want, "{range}");
    }
    let e = get_object(s3, "kvbm", &key, Some("bytes=2000000-2000001"))
        .await
        .expect_err("past the end");
    assert_eq!(code(&e), "InvalidRange");
}

/// Listing: by prefix, a page at a time, and folded by a delimiter.
async fn listings_page_and_fold(s3: &aws_sdk_s3::Client) {
    for k in ["dir/a", "dir/b", "dir/sub/c", "dir/sub/d", "other"] {
        put(s3, "kvbm", k, ByteStream::from(k.as_bytes().to_vec()))
            .await
            .expect("put");
    }
    let mut keys = Vec::new();
    let mut token = None;
    loop {
        let page = s3
            .list_objects_v2()
            .bucket("kvbm")
            .prefix("dir/")
            .max_keys(3)
            .set_continuation_token(token)
            .send()
            .await
            .expect("list");
        for o in page.contents() {
            let k = o.key().unwrap_or_default();
            assert_eq!(o.size(), Some(k.len() as i64), "{k} holds its own name");
            keys.push(k.to_string());
        }
        token = page.next_continuation_token().map(str::to_string);
        if !page.is_truncated().unwrap_or(false) {
            break;
        }
    }
    assert_eq!(keys, ["dir/a", "dir/b", "dir/sub/c", "dir/sub/d"]);
    let folded = s3
        .list_objects_v2()
        .bucket("kvbm")
        .prefix("dir/")
        .delimiter("/")
        .send()
        .await
        .expect("list with a delimiter");
    let objects: Vec<_> = folded.contents().iter().filter_map(|o| o.key()).collect();
    let prefixes: Vec<_> = folded
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!(
        (objects, prefixes),
        (vec!["dir/a", "dir/b"], vec!["dir/sub/"])
    );
}

/// Deletes: one (twice), many (absent keys are deleted too); then the bucket, refused while
/// blocks are left in it.
async fn deletes_of_one_and_many_keys(s3: &aws_sdk_s3::Client) {
    for what in ["delete", "delete again"] {
        s3.delete_object()
            .bucket("kvbm")
            .key("other")
            .send()
            .await
            .expect(what);
    }
    let del = aws_sdk_s3::types::Delete::builder()
        .set_objects(Some(
            ["dir/a", "dir/b", "dir/sub/c", "dir/sub/d", "never"]
                .iter()
                .map(|k| {
                    aws_sdk_s3::types::ObjectIdentifier::builder()
                        .key(*k)
                        .build()
                        .expect("id")
                })
                .collect(),
        ))
        .build()
        .expect("delete");
    let out = s3
        .delete_objects()
        .bucket("kvbm")
        .delete(del)
        .send()
        .await
        .expect("delete objects");
    assert_eq!(out.deleted().len(), 5);
    assert!(out.errors().is_empty());
    let e = s3
        .delete_bucket()
        .bucket("kvbm")
        .send()
        .await
        .expect_err("not empty");
    assert_eq!(code(&e), "BucketNotEmpty");
}

/// Bad input is refused with an S3 error and nothing is stored: a body over the node's
/// value limit (here 24 MiB), a Content-MD5 or CRC32C that does not match, a key over the
/// key limit. An object over one record (8 MiB) is stored as extents, and a ranged GET
/// reads only what it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_puts_are_refused_and_store_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), _]) = node_with_s3_tokens(dir.path()).await;
    let s3 = client(&node, &ak, &sk);
    create_bucket(&s3, "kvbm").await;
    let large = common::block(9, (8 << 20) + 1);
    put(&s3, "kvbm", "large", ByteStream::from(large.to_vec()))
        .await
        .expect("an object over one record");
    assert_eq!(get_bytes(&s3, "kvbm", "large", None).await, large);
    let read_before = device_read_bytes(&node).await;
    let (lo, hi) = ((4 << 20) - 10, (4 << 20) + 9);
    let part = get_bytes(&s3, "kvbm", "large", Some(format!("bytes={lo}-{hi}"))).await;
    assert_eq!(part, large.slice(lo..hi + 1));
    let read = device_read_bytes(&node).await - read_before;
    assert!(
        read <= 2 * ((4 << 20) + 4096),
        "a 20-byte range read {read} bytes of flash: only the two extents that hold it"
    );
    s3.delete_object()
        .bucket("kvbm")
        .key("large")
        .send()
        .await
        .expect("delete");
    let big = vec![7u8; (24 << 20) + 1];
    let e = put(&s3, "kvbm", "big", ByteStream::from(big))
        .await
        .expect_err("over the limit");
    assert_eq!(code(&e), "EntityTooLarge", "{e:?}");
    let data = common::block(1, 100_000);
    let e = s3
        .put_object()
        .bucket("kvbm")
        .key("md5")
        .content_md5("AAAAAAAAAAAAAAAAAAAAAA==")
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .expect_err("a wrong MD5");
    assert_eq!(code(&e), "BadDigest", "{e:?}");
    let e = s3
        .put_object()
        .bucket("kvbm")
        .key("crc")
        .checksum_crc32_c("AAAAAA==")
        .body(ByteStream::from(data.to_vec()))
        .send()
        .await
        .expect_err("a wrong CRC32C");
    assert_eq!(code(&e), "BadDigest", "{e:?}");
    let e = put(
        &s3,
        "kvbm",
        &"k".repeat(129),
        ByteStream::from(data.to_vec()),
    )
    .await
    .expect_err("a key over 128 bytes");
    assert_eq!(code(&e), "KeyTooLongError", "{e:?}");
    assert_bucket_empty(&s3, "kvbm").await;
    // The node serves on.
    put(&s3, "kvbm", "fine", ByteStream::from(data.to_vec()))
        .await
        .expect("a good put");
}

/// Credentials: a wrong secret, another tenant's bucket, a tampered or expired presigned
/// URL are refused; a tenant's ListBuckets shows its own buckets only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signatures_and_tenants_are_enforced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), (bk, bs)]) = node_with_s3_tokens(dir.path()).await;
    let a = client(&node, &ak, &sk);
    let b = client(&node, &bk, &bs);
    create_bucket(&a, "mine").await;
    put(&a, "mine", "k", ByteStream::from_static(b"a's bytes"))
        .await
        .expect("put");
    let wrong = client(&node, &ak, &bs);
    assert_eq!(
        get_refused(&wrong, "mine", "k").await,
        "SignatureDoesNotMatch"
    );
    let nobody = client(&node, "nobody", &sk);
    assert_eq!(
        get_refused(&nobody, "mine", "k").await,
        "InvalidAccessKeyId"
    );
    // b's "mine" is b's own namespace: a's is out of reach.
    assert_eq!(get_refused(&b, "mine", "k").await, "NoSuchBucket");
    create_bucket(&b, "theirs").await;
    assert_eq!(bucket_names(&a).await, ["mine"]);
    assert_eq!(bucket_names(&b).await, ["theirs"]);
    presigned_urls_are_checked(&node, &a).await;
}

/// The buckets `s3`'s ListBuckets shows.
async fn bucket_names(s3: &aws_sdk_s3::Client) -> Vec<String> {
    let l = s3.list_buckets().send().await.expect("list");
    l.buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_string))
        .collect()
}

/// A presigned URL of a GET of `mine/k` by `s3`, valid for as long as `config` says.
async fn presigned_get(
    s3: &aws_sdk_s3::Client,
    config: aws_sdk_s3::presigning::PresigningConfig,
) -> String {
    s3.get_object()
        .bucket("mine")
        .key("k")
        .presigned(config)
        .await
        .expect("presign")
        .uri()
        .to_string()
}

/// The status a plain GET of `url` is answered.
async fn status_of_get(http: &reqwest::Client, url: &str) -> u16 {
    http.get(url).send().await.expect("get").status().as_u16()
}

/// Presigned GETs of `a`'s block `mine/k`: valid, then tampered, then expired; one valid
/// for a week; and no signature at all.
async fn presigned_urls_are_checked(node: &Node, a: &aws_sdk_s3::Client) {
    let presign = |secs| {
        aws_sdk_s3::presigning::PresigningConfig::expires_in(std::time::Duration::from_secs(secs))
            .expect("presigning")
    };
    let url = presigned_get(a, presign(60)).await;
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let http = reqwest::Client::new();
    let r = http.get(&url).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(&r.bytes().await.expect("body")[..], b"a's bytes");
    let tampered = url.replace("/mine/k", "/mine/K");
    assert_eq!(status_of_get(&http, &tampered).await, 403);
    let short = presigned_get(a, presign(1)).await;
    common::eventually(
        std::time::Duration::from_secs(10),
        "the presigned URL expires",
        async || status_of_get(&http, &short).await == 403,
    )
    .await;
    let week = aws_sdk_s3::presigning::PresigningConfig::builder()
        .expires_in(std::time::Duration::from_secs(7 * 24 * 3600))
        .build()
        .expect("presigning");
    let ok = presigned_get(a, week).await;
    assert_eq!(status_of_get(&http, &ok).await, 200);
    // No signature at all.
    let anon = format!("{}/mine/k", s3_url(node));
    assert_eq!(status_of_get(&http, &anon).await, 403);
}

/// With authentication off (the embedded loopback default) any credentials act as the
/// admin; a body in signed aws-chunked framing is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auth_any_credentials_are_the_admin() {
    let node = Node::fresh(&["--capacity", "256MiB", "--s3-listen", "127.0.0.1:0"]).await;
    let s3 = client(&node, "anyone", "anything");
    let file = node.scratch().join("block.bin");
    std::fs::write(&file, b"streamed").expect("write");
    let e = s3
        .put_object()
        .bucket("default")
        .key("streamed")
        .body(ByteStream::from_path(&file).await.expect("from path"))
        .send()
        .await
        .expect_err("signed chunks without auth");
    assert_eq!(code(&e), "NotImplemented", "{e:?}");
    put(
        &s3,
        "default",
        "0123456789abcdef",
        ByteStream::from_static(b"kv"),
    )
    .await
    .expect("put");
    // The same block through HTTP API v1: the key is the object key's bytes.
    let got = node
        .client
        .get("default", b"0123456789abcdef")
        .await
        .expect("get");
    assert_eq!(got.as_deref(), Some(&b"kv"[..]));
    common::metrics_contain(
        &node,
        "ctxpod_s3_requests_total{code=\"OK\",op=\"PutObject\"} 1",
    )
    .await;
}

/// A request signed 20 minutes ago (a replay, or a client's clock that far off) is refused
/// with RequestTimeTooSkewed, and a PUT of it stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_the_clock_skew_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), _]) = node_with_s3_tokens(dir.path()).await;
    let now = client(&node, &ak, &sk);
    create_bucket(&now, "kvbm").await;
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(20 * 60);
    // A client whose clock is 20 minutes behind; the SDK learns the skew from a refusal
    // and signs again with the server's clock, so each request gets a client of its own,
    // and no retry.
    let stale = || {
        let conf = client_config(&node, &ak, &sk)
            .time_source(aws_smithy_async::time::StaticTimeSource::new(then))
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
            .build();
        aws_sdk_s3::Client::from_conf(conf)
    };
    let e = stale()
        .put_object()
        .bucket("kvbm")
        .key("k")
        .body(ByteStream::from_static(b"replayed"))
        .send()
        .await
        .expect_err("a stale signature");
    assert_eq!(code(&e), "RequestTimeTooSkewed", "{e:?}");
    let e = stale()
        .list_buckets()
        .send()
        .await
        .expect_err("a stale signature");
    assert_eq!(code(&e), "RequestTimeTooSkewed", "{e:?}");
    assert_bucket_empty(&now, "kvbm").await;
}

/// Raw bytes a client may send (authentication off, so that no signature stands in the
/// way): malformed XML, a header over hyper's limit, a body shorter than its
/// Content-Length, one announced over the limit. Each is an S3 error or a closed
/// connection, never a 5xx; nothing is stored; the node serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_s3_errors_and_store_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = Node::fresh(&["--capacity", "256MiB", "--s3-listen", "127.0.0.1:0"]).await;
    let url = s3_url(&node);
    let addr = url.trim_start_matches("http://").to_string();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let http = reqwest::Client::new();
    let send = |method: reqwest::Method, path: &str| http.request(method, format!("{url}{path}"));
    // Malformed XML in a DeleteObjects (with the checksum S3 requires of its body).
    for body in [
        "<Delete><Object><Key>k</Key>",
        "not xml at all",
        "<Delete></Nope>",
    ] {
        malformed_xml_is_refused(send(reqwest::Method::POST, "/default?delete"), body).await;
    }
    // A huge header: refused before any handler.
    let r = send(reqwest::Method::GET, "/default/k")
        .header("x-amz-meta-huge", "h".repeat(1 << 20))
        .send()
        .await;
    assert!(
        r.map_or(true, |r| r.status().is_client_error()),
        "a 1 MiB header is refused"
    );
    // A body announced over the limit (the node's value_bytes_max, 256 MiB, and the room
    // for aws-chunked framing): EntityTooLarge at once.
    let mut s = raw_unsigned_put(&addr, "big", 300 << 20, "").await;
    let mut answer = vec![0u8; 4096];
    let n = s.read(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("EntityTooLarge"), "{answer}");
    // A body shorter than its Content-Length, then the client stops sending.
    let mut s = raw_unsigned_put(&addr, "short", 100_000, &"x".repeat(50_000)).await;
    s.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    let rest = String::from_utf8_lossy(&rest).to_string();
    assert!(
        !rest.starts_with("HTTP/1.1 2"),
        "a short body is not stored: {rest}"
    );
    assert!(!rest.starts_with("HTTP/1.1 5"), "{rest}");
    for key in [&b"big"[..], b"short", b"k"] {
        assert_eq!(node.client.get("default", key).await.expect("get"), None);
    }
    // The node serves on.
    let s3 = client(&node, "anyone", "anything");
    put(&s3, "default", "fine", ByteStream::from_static(b"fine"))
        .await
        .expect("a good put");
    assert!(!metrics_have_5xx(&node).await, "no 5xx was answered");
}

/// Checks that a DeleteObjects `req` whose `body` is malformed XML (with the checksum S3
/// requires of its body) is answered 400 MalformedXML.
async fn malformed_xml_is_refused(req: reqwest::RequestBuilder, body: &str) {
    use base64::Engine as _;
    let sha = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, body.as_bytes());
    let r = req
        .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
        .header(
            "x-amz-checksum-sha256",
            base64::engine::general_purpose::STANDARD.encode(sha.as_ref()),
        )
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400, "{body}");
    let text = r.text().await.expect("body");
    assert!(text.contains("<Code>MalformedXML</Code>"), "{body}: {text}");
}

/// A raw connection to the S3 door at `addr` on which an unsigned PutObject of
/// `default/<key>` announcing `content_length` bytes was sent, with `body` (which may be
/// shorter).
async fn raw_unsigned_put(
    addr: &str,
    key: &str,
    content_length: usize,
    body: &str,
) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!(
            "PUT /default/{key} HTTP/1.1\r\nhost: {addr}\r\nx-amz-content-sha256: \
             UNSIGNED-PAYLOAD\r\ncontent-length: {content_length}\r\n\r\n{body}"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    s
}

/// Whether the node answered any S3 request with an internal error.
async fn metrics_have_5xx(node: &Node) -> bool {
    let m = node.client.metrics().await.expect("metrics");
    m.lines()
        .any(|l| l.starts_with("ctxpod_s3_requests_total") && l.contains("InternalError"))
}

/// The object's bytes (`range`: an HTTP Range), read whole.
async fn get_bytes(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
    range: Option<String>,
) -> bytes::Bytes {
    let out = s3
        .get_object()
        .bucket(bucket)
        .key(key)
        .set_range(range)
        .send()
        .await
        .expect("get object");
    out.body.collect().await.expect("body").into_bytes()
}

/// What the node has read from its device so far (`ctxpod_device_read_bytes_total`).
async fn device_read_bytes(node: &Node) -> u64 {
    let text = node
        .request(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    common::metric_of(&text, "ctxpod_device_read_bytes_total") as u64
}

/// A range of a block (one record of up to 8 MiB, sealed and checksummed in 64 KiB
/// segments) reads from flash only the segments that hold it and the record's first 4 KiB
/// (header and segment table), through every door: a ranged GetObject (S3), a GET with
/// `Range` (HTTP), a `GetValue` with an offset (CXP1, the SDK's transport). A whole GET
/// reads the whole record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_a_block_reads_only_the_segments_that_hold_it_through_every_door() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), _]) = node_with_s3_tokens(dir.path()).await;
    let s3 = client(&node, &ak, &sk);
    create_bucket(&s3, "kvbm").await;
    // The largest block: 8 MiB, one record (a KVBM block of a 70B model is about this).
    let len = ctxpod_wire::BLOCK_BYTES_MAX;
    let obj = common::block(21, len);
    put(&s3, "kvbm", "block", ByteStream::from(obj.to_vec()))
        .await
        .expect("put object");
    let blk = common::block(22, len);
    common::put_durable(&node.client, "default", b"blk", blk.clone()).await;
    let seg = ctxpod_format::record::SEGMENT_BYTES;
    let reads = |segments: usize| (4096 + segments * seg) as u64;

    // S3: 20 bytes across the boundary of segments 2 and 3.
    let before = device_read_bytes(&node).await;
    let (lo, hi) = (3 * seg - 10, 3 * seg + 9);
    let part = get_bytes(&s3, "kvbm", "block", Some(format!("bytes={lo}-{hi}"))).await;
    assert_eq!(part, obj.slice(lo..hi + 1));
    assert_eq!(device_read_bytes(&node).await - before, reads(2), "S3");

    // HTTP: the last 100 bytes.
    let before = device_read_bytes(&node).await;
    let r = node
        .request(reqwest::Method::GET, "/v1/namespaces/default/blocks/626c6b")
        .header("range", "bytes=-100")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 206);
    let range = r.headers()["content-range"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert_eq!(range, format!("bytes {}-{}/{len}", len - 100, len - 1));
    assert_eq!(r.bytes().await.expect("body"), blk.slice(len - 100..));
    assert_eq!(device_read_bytes(&node).await - before, reads(1), "HTTP");

    // CXP1: segments 5..9.
    let before = device_read_bytes(&node).await;
    let c = node.wire().await;
    let key = bytes::Bytes::from_static(b"blk");
    let (lo, hi) = (5 * seg + 1, 9 * seg);
    let got = c
        .get_value("default", &key, Some((lo as u64, hi as u64)))
        .await;
    assert_eq!(got.expect("get value").as_deref(), Some(&blk[lo..hi]));
    assert_eq!(device_read_bytes(&node).await - before, reads(4), "CXP1");

    // The whole block: its whole record.
    let before = device_read_bytes(&node).await;
    assert_eq!(get_bytes(&s3, "kvbm", "block", None).await, obj);
    let record = ctxpod_format::record::record_bytes(len) as u64;
    assert_eq!(device_read_bytes(&node).await - before, record, "whole");
}

/// CreateBucket with `x-ctxpod-namespace-class: weights` makes a `weights` namespace, and
/// with `x-ctxpod-compression: zstd` a compressed one (the HTTP API shows them so); without
/// the headers a bucket is `kv`, uncompressed; an unknown class or codec is refused
/// (InvalidArgument) and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_takes_its_namespace_class_and_compression_from_headers() {
    use ctxpod_wire::types::{Compression, NamespaceClass, NamespaceInfo};
    let dir = tempfile::tempdir().expect("tempdir");
    let (node, [(ak, sk), _]) = node_with_s3_tokens(dir.path()).await;
    let s3 = client(&node, &ak, &sk);
    let create = |name: &'static str, header: &'static str, value: &'static str| {
        s3.create_bucket()
            .bucket(name)
            .customize()
            .mutate_request(move |r| {
                r.headers_mut().insert(header, value);
            })
            .send()
    };
    let (class, compression) = (
        ctxpod_wire::HEADER_NAMESPACE_CLASS,
        ctxpod_wire::HEADER_NAMESPACE_COMPRESSION,
    );
    create("experts", class, "weights").await.expect("create");
    create("zipped", compression, "zstd").await.expect("create");
    create_bucket(&s3, "kvcache").await;
    for (header, value) in [(class, "cold"), (compression, "gzip")] {
        let refused = create("cold", header, value).await.expect_err(value);
        assert_eq!(code(&refused), "InvalidArgument", "{refused:?}");
    }
    let class_of = |ns: &'static str| {
        let node = &node;
        async move {
            let r = node
                .request(reqwest::Method::GET, &format!("/v1/namespaces/{ns}"))
                .header(ctxpod_wire::HEADER_TENANT, "a")
                .send()
                .await
                .expect("send");
            assert_eq!(r.status(), 200, "{ns}");
            let i = r.json::<NamespaceInfo>().await.expect("json");
            (i.class, i.compression)
        }
    };
    assert_eq!(class_of("experts").await, (NamespaceClass::Weights, None));
    assert_eq!(
        class_of("zipped").await,
        (NamespaceClass::Kv, Some(Compression::Zstd))
    );
    assert_eq!(class_of("kvcache").await, (NamespaceClass::Kv, None));
    assert_eq!(bucket_names(&s3).await, ["experts", "kvcache", "zipped"]);
}

package cocoon

import (
	"context"
	"io"
)

// ImageImport imports a qcow2 (becomes a cloud image) or tar (becomes an OCI image) from r under
// name and returns the image. cocoon prints nothing for an import, so it is looked up by name.
func (c *Client) ImageImport(ctx context.Context, r io.Reader, name string) (*Image, error) {
	if _, err := c.run(ctx, call{args: []string{"image", "import", name}, stdin: r, timeout: transferTimeout, long: true}); err != nil {
		return nil, err
	}
	return c.ImageInspect(ctx, name)
}

// PullOptions tune an image pull.
type PullOptions struct {
	// DockerConfig is a directory holding a docker config.json with the registry's credentials:
	// cocoon reads credentials only from the docker keychain (DOCKER_CONFIG). Empty: cocoon's
	// own environment decides.
	DockerConfig string
}

// ImagePull pulls an OCI image reference (or downloads a cloud image URL) and returns it. cocoon
// stores the literal reference string, so the same string must be used to run the image.
func (c *Client) ImagePull(ctx context.Context, ref string, o PullOptions) (*Image, error) {
	cl := call{args: []string{"image", "pull", ref}, timeout: transferTimeout, long: true}
	if o.DockerConfig != "" {
		cl.env = []string{"DOCKER_CONFIG=" + o.DockerConfig}
	}
	if _, err := c.run(ctx, cl); err != nil {
		return nil, err
	}
	return c.ImageInspect(ctx, ref)
}

// ImageInspect returns one image by reference or digest.
func (c *Client) ImageInspect(ctx context.Context, ref string) (*Image, error) {
	return query[Image](ctx, c, "image", "inspect", ref)
}

// ImageList returns every image of both backends.
func (c *Client) ImageList(ctx context.Context) ([]Image, error) {
	return queryList[Image](ctx, c, "image", "list")
}

// ImageRemove deletes an image's index entry (cocoon frees the blobs at gc). A missing image is
// ErrNotFound.
func (c *Client) ImageRemove(ctx context.Context, ref string) error {
	_, err := c.run(ctx, call{args: []string{"image", "rm", ref}})
	return err
}
